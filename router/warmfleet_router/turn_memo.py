"""An agent's prompt keyed once: per session, what keying its last request left (its
rendered text, tokens, cuts and block keys), so a request that extends it renders
once, tokenizes and hashes only what the turn appends (`continuation` checks each
reuse; a request that edits its history is keyed whole). The blocks are exactly those
`LayoutKeyer.chat` gives.

One memo per process (the router's threads share one, each key worker has its own),
least recently used sessions forgotten first, within a count and a byte budget. A
session is the tenant's, keyed per layout: tenants never continue each other's entries.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from warmfleet_common.continuation import ChatState, continuable, continue_chat
from warmfleet_router.keys import UNSALTED, LayoutKeyer, RequestBlocks, Salt

DEFAULT_MAX_SESSIONS = 1024
DEFAULT_BUDGET_BYTES = 32 << 20
_ENTRY_OVERHEAD = 400  # the entry, its key and its node in the OrderedDict
_KEY_BYTES = 90  # a block key (bytes object) and its end (int) in their tuples


@dataclass(frozen=True)
class _Entry:
    state: ChatState
    salt: Salt
    blocks: RequestBlocks

    @property
    def size_bytes(self) -> int:
        unsalted = len(self.blocks.unsalted) * _KEY_BYTES
        return self.state.size_bytes + len(self.blocks.keys) * _KEY_BYTES + unsalted


class TurnMemo:
    """Session -> its last request's keying, for `LayoutKeyer` chats; thread-safe."""

    def __init__(
        self, max_sessions: int = DEFAULT_MAX_SESSIONS, budget_bytes: int = DEFAULT_BUDGET_BYTES
    ) -> None:
        self.max_sessions = max_sessions
        self.budget_bytes = budget_bytes
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._sizes: dict[str, int] = {}
        self._bytes = 0
        self._lock = threading.Lock()  # prepared on the router's threads concurrently
        self.continued = 0  # requests that reused tokens of their session's last one
        self.whole = 0  # requests keyed whole (a new session, an edited history, ...)
        self.forgotten = 0  # sessions dropped for the count or the byte budget

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def size_bytes(self) -> int:
        return self._bytes

    def chat(
        self,
        keyer: LayoutKeyer,
        session: str,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None,
        template_kwargs: Mapping[str, Any] | None = None,
        salt: Salt = UNSALTED,
    ) -> RequestBlocks:
        """`keyer.chat(messages, tools, template_kwargs, salt)`, continuing the session's
        last request where it can."""
        if not continuable(keyer.prompts):
            return keyer.chat(messages, tools, template_kwargs, salt)
        key = f"{keyer.fingerprint}\0{session}"
        with self._lock:
            entry = self._entries.get(key)
        turn, state = continue_chat(
            keyer.prompts, messages, tools, template_kwargs, entry.state if entry else None
        )
        prior = entry.blocks if entry is not None and entry.salt == salt else None
        blocks = keyer.resumed(turn.tokens, turn.cuts, salt, prior, turn.reused)
        self._store(key, _Entry(state, salt, blocks), continued=turn.reused > 0)
        return blocks

    def _store(self, key: str, entry: _Entry, continued: bool) -> None:
        size = entry.size_bytes + _ENTRY_OVERHEAD + 2 * len(key)
        with self._lock:
            if continued:
                self.continued += 1
            else:
                self.whole += 1
            self._bytes -= self._sizes.pop(key, 0)
            self._entries.pop(key, None)
            if size > self.budget_bytes // 4:
                return  # one huge conversation would push out every other session
            self._entries[key] = entry
            self._sizes[key] = size
            self._bytes += size
            while len(self._entries) > self.max_sessions or self._bytes > self.budget_bytes:
                old, _ = self._entries.popitem(last=False)
                self._bytes -= self._sizes.pop(old)
                self.forgotten += 1
