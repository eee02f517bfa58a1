"""`warmfleet audit LOG`: why a prefix cache misses, from a log of requests
(`analysis`), printed as tables or JSON (`report`)."""
