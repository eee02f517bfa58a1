"""warmfleet router: an OpenAI-compatible gateway that sends each request to the daemon
holding most of its prefix (precise, from the daemons' cache events), with bounded load,
session affinity and failover."""
