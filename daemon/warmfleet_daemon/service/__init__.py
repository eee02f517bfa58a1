"""`warmfleet service install/uninstall`: the daemon as a launchd job (macOS) or a
systemd unit (Linux) that starts at boot or login and restarts when it exits."""
