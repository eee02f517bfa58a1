"""`warmfleet sim`: a simulated fleet's workloads (agent-population traces)."""
