"""Session keys and where each session was last served.

A request's session key comes from the first of a configurable list of sources that
has one: a header (`header:x-session-affinity`) or a field of the JSON body
(`body:metadata.user_id`), so agents' own session ids (Claude Code's
`X-Claude-Code-Session-Id`, the Responses API's `prompt_cache_key`) are a source more,
not code more. The session table maps keys to backends, least recently used forgotten
first. Plain Python, no I/O.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

DEFAULT_SOURCES = ("header:x-session-affinity", "header:x-prefix-hash")
MAX_SESSIONS = 100_000


@dataclass(frozen=True)
class KeySource:
    kind: str  # "header" or "body"
    path: tuple[str, ...]  # a header name (lowercase), or the body's field path

    @classmethod
    def parse(cls, text: str) -> KeySource:
        kind, _, where = text.partition(":")
        if kind not in ("header", "body") or not where or any(not p for p in where.split(".")):
            raise ValueError(
                f"session key source {text!r}: expected header:NAME or body:FIELD[.FIELD...]"
            )
        if kind == "header":
            return cls(kind, (where.lower(),))
        return cls(kind, tuple(where.split(".")))

    def find(self, headers: Mapping[str, str], body: Mapping[str, Any] | None) -> str | None:
        if self.kind == "header":
            return headers.get(self.path[0]) or None
        value: Any = body
        for part in self.path:
            if not isinstance(value, Mapping):
                return None
            value = value.get(part)
        return value if isinstance(value, str) and value else None


class SessionKeys:
    """The first session key any source finds."""

    def __init__(self, sources: Sequence[str] = DEFAULT_SOURCES) -> None:
        self.sources = tuple(KeySource.parse(s) for s in sources)

    def of(self, headers: Mapping[str, str], body: Mapping[str, Any] | None) -> str | None:
        for source in self.sources:
            found = source.find(headers, body)
            if found is not None:
                return found
        return None


class SessionTable:
    """Session key -> the backend that last served it."""

    def __init__(self, max_sessions: int = MAX_SESSIONS) -> None:
        self._max = max_sessions
        self._backends: OrderedDict[str, str] = OrderedDict()

    def __len__(self) -> int:
        return len(self._backends)

    def get(self, key: str) -> str | None:
        return self._backends.get(key)

    def served(self, key: str, backend: str) -> None:
        self._backends[key] = backend
        self._backends.move_to_end(key)
        while len(self._backends) > self._max:
            self._backends.popitem(last=False)
