"""The simulated engine: the daemon with its forward pass replaced by the times a
machine's performance profile says (`warmfleet serve --engine sim --profile NAME|FILE`)."""
