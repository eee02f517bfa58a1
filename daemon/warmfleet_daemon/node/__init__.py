"""The daemon as a node of a fleet: `warmfleet service install/uninstall` (a launchd job
on macOS, a systemd unit on Linux, restarted when it exits) and `serve --register NAME`
(the daemon creates or updates its own WarmNode)."""
