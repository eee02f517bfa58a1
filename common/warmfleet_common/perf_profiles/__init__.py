"""The performance profiles that ship with warmfleet (JSON, one per machine and model);
see `warmfleet_common.perf_profile`."""
