"""Stop strings over streamed text: emit what cannot be the start of a stop string,
hold back the rest until it is decided. (Token-level stop matching, as in mlx-lm,
misses stop strings that span or split tokens.)"""

from __future__ import annotations

from collections.abc import Sequence


class StopStringFilter:
    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = tuple(s for s in stops if s)
        self._held = ""

    def feed(self, text: str) -> tuple[str, bool]:
        """Add decoded text; return (text safe to emit, whether a stop string ended it)."""
        if not self._stops:
            return text, False
        buffer = self._held + text
        hits = [i for i in (buffer.find(s) for s in self._stops) if i >= 0]
        if hits:
            self._held = ""
            return buffer[: min(hits)], True
        keep = self._partial_suffix(buffer)
        self._held = buffer[len(buffer) - keep :] if keep else ""
        return buffer[: len(buffer) - keep], False

    def flush(self) -> str:
        """The held-back text, when generation ends for another reason."""
        held, self._held = self._held, ""
        return held

    def _partial_suffix(self, buffer: str) -> int:
        """Length of the longest suffix of `buffer` that is a proper prefix of a stop."""
        longest = 0
        for stop in self._stops:
            for k in range(min(len(stop) - 1, len(buffer)), longest, -1):
                if stop.startswith(buffer[-k:]):
                    longest = k
                    break
        return longest
