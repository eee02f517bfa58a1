"""The running daemon: its settings, the assembly of model, engine, tiers and warm sets
that the routes share, the drain on SIGTERM, and what it reports about itself
(OpenTelemetry metrics, live cache diagnostics)."""
