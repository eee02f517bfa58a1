"""Session keys and where each session was last served.

A request's session key comes from the first of a configurable list of sources that
has one: a header (`header:x-session-affinity`) or a field of the JSON body
(`body:metadata.user_id`), so agents' own session ids (Claude Code's
`X-Claude-Code-Session-Id`, the Responses API's `prompt_cache_key`) are a source more,
not code more; a body field that is a JSON object with a `session_id` gives that id.
The session table maps keys to backends, least recently used forgotten first, within a
byte budget as well as a count. A key longer than MAX_KEY_CHARS is kept
as its hash (a 60 KB header costs what a 32-byte one does). The status names sessions
by a keyed digest (`SessionDigest`), never by their keys. Plain Python, no I/O.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# Explicit affinity first, then the agents' own session ids: Claude Code's header, the
# Responses API's `prompt_cache_key` (Codex's thread id), Anthropic's `metadata.user_id`
# (Claude Code's is a JSON string whose `session_id` is used).
DEFAULT_SOURCES = (
    "header:x-session-affinity",
    "header:x-prefix-hash",
    "header:x-claude-code-session-id",
    "body:prompt_cache_key",
    "body:metadata.user_id",
)
MAX_SESSIONS = 100_000
DEFAULT_BUDGET_BYTES = 16 << 20
MAX_KEY_CHARS = 256
# A session's entry besides its key's characters: the OrderedDict node, the str headers
# and the backend name (shared); measured with tracemalloc.
ENTRY_OVERHEAD = 200


def capped(key: str) -> str:
    """`key` itself, or its hash when it is longer than MAX_KEY_CHARS."""
    if len(key) <= MAX_KEY_CHARS:
        return key
    digest = hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()
    return f"blake2b:{digest}"


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

    def find(self, headers: Mapping[str, str]) -> str | None:
        return headers.get(self.path[0]) or None if self.kind == "header" else None


class SessionKeys:
    """The first session key any source finds."""

    def __init__(self, sources: Sequence[str] = DEFAULT_SOURCES) -> None:
        self.sources = tuple(KeySource.parse(s) for s in sources)

    @property
    def body_paths(self) -> tuple[tuple[str, ...], ...]:
        """The body fields to read (by the request's preparation, off the event loop)."""
        return tuple(s.path for s in self.sources if s.kind == "body")

    def of(self, headers: Mapping[str, str], body_values: Sequence[str | None] = ()) -> str | None:
        """The first key found: headers as they are, body fields as read at `body_paths`
        (in that order)."""
        values = iter(body_values)
        for source in self.sources:
            found = source.find(headers) if source.kind == "header" else next(values, None)
            if found:
                return capped(found)
        return None


def body_values(body: Mapping[str, Any], paths: Sequence[Sequence[str]]) -> tuple[str | None, ...]:
    """The string at each path of a JSON body (None where there is none)."""
    return tuple(_field(body, path) for path in paths)


def _field(body: Mapping[str, Any], path: Sequence[str]) -> str | None:
    value: Any = body
    for part in path:
        if not isinstance(value, Mapping):
            return None
        value = value.get(part)
    if not isinstance(value, str) or not value:
        return None
    return _session_id(value) or value


def _session_id(value: str) -> str | None:
    """The `session_id` of a value that is a JSON object holding one (Claude Code's
    `metadata.user_id`: its device id stays the same across sessions, its session id
    does not); None for any other value."""
    if not value.startswith("{") or len(value) > 4096:
        return None
    try:
        parsed = json.loads(value)
    except ValueError:
        return None
    found = parsed.get("session_id") if isinstance(parsed, dict) else None
    return found if isinstance(found, str) and found else None


class SessionTable:
    """Session key -> the backend that last served it."""

    def __init__(
        self, max_sessions: int = MAX_SESSIONS, budget_bytes: int = DEFAULT_BUDGET_BYTES
    ) -> None:
        self._max = max_sessions
        self.budget_bytes = budget_bytes
        self._backends: OrderedDict[str, str] = OrderedDict()
        self._bytes = 0
        self.forgotten = 0  # sessions dropped for the count or the byte budget

    def __len__(self) -> int:
        return len(self._backends)

    @property
    def size_bytes(self) -> int:
        return self._bytes

    def get(self, key: str) -> str | None:
        return self._backends.get(capped(key))

    def served(self, key: str, backend: str) -> None:
        key = capped(key)
        if key not in self._backends:
            self._bytes += _cost(key)
        self._backends[key] = backend
        self._backends.move_to_end(key)
        while self._backends and (
            len(self._backends) > self._max or self._bytes > self.budget_bytes
        ):
            old, _ = self._backends.popitem(last=False)
            self._bytes -= _cost(old)
            self.forgotten += 1


def _cost(key: str) -> int:
    return ENTRY_OVERHEAD + len(key.encode("utf-8", "surrogatepass"))


class SessionDigest:
    """A session key as the status shows it: keyed per process, so it tells two
    decisions' (or handoffs') sessions apart without saying (or confirming a guess of)
    the key."""

    def __init__(self) -> None:
        self._secret = os.urandom(16)

    def __call__(self, key: str | None) -> str | None:
        if key is None:
            return None
        digest = hashlib.blake2b(key.encode("utf-8", "surrogatepass"), key=self._secret)
        return digest.hexdigest()[:16]
