"""`warmfleet warm-prompts`: get the warm prompt of an agent from the agent itself
(`capture`: a one-shot endpoint that records its first request)."""
