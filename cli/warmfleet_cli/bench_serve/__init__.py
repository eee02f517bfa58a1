"""Benchmarks over HTTP: `warmfleet bench-serve` (cold vs warm TTFT, throughput and
cached tokens against any OpenAI-compatible server) and `warmfleet bench-compare`.
Plain HTTP clients: nothing here imports mlx."""
