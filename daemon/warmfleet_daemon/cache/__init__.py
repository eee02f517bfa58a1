"""The prefix (KV) cache index and its change log: plain Python, no mlx."""
