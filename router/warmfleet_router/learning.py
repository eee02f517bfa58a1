"""Warm prompts the router learns from the traffic it routes.

Each request of an agent API (chat completions, the Messages API, the Responses API)
has a static head: what `warmfleet warm-prompts capture` keeps of it (the system prompt,
the tools and the messages before the first user message, in that API's shape:
`warmfleet_common.agent_apis.prefix`). `head_of` computes it while the request is
prepared (off the event loop); the user message and everything after it never reach
it (they are replaced by a placeholder before the head is read). The `LearnedTable`
counts, per tenant, the distinct sessions (the router's session keys) that sent each
head within a sliding window of `LearnOptions.ttl`: until `min_sessions` distinct
sessions have sent one, only its digest and those sessions' keyed digests are kept;
then it becomes a learned warm prompt (its text kept, with when it was first and last
seen, how many sessions sent it, and how much of the first requests that used it since
was read from cache). One that no request used for `ttl` is forgotten. Bounded: at
most `max_candidates` heads counted, `max_prompts` learned prompts and `max_bytes` of
their text (the least recently used go first); a head over `max_head_bytes` is never
learned. A tenant's heads are its own: counted, learned and listed under its name.
Plain Python, no I/O.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from warmfleet_common.agent_apis.prefix import agent_name, warm_prompt
from warmfleet_common.agent_apis.shapes import ApiName

log = logging.getLogger(__name__)

DEFAULT_MIN_SESSIONS = 3
DEFAULT_TTL_S = 7 * 24 * 3600.0
DEFAULT_MAX_PROMPTS = 64
DEFAULT_MAX_BYTES = 8 << 20
DEFAULT_MAX_CANDIDATES = 10_000
MAX_HEAD_BYTES = 1 << 20  # Claude Code's head is ~50 KB
MAX_SEEN = 100_000  # (session, head) pairs remembered, to tell a session's first request
# The routes whose requests have a static head, and their API shape.
LEARNED_ROUTES: Mapping[str, ApiName] = {
    "chat": "chat",
    "messages": "anthropic",
    "responses": "responses",
}
# What stands in for the first user message (and all after it) when a head is read.
_PLACEHOLDER: Mapping[ApiName, dict[str, Any]] = {
    "chat": {"role": "user", "content": "."},
    "anthropic": {"role": "user", "content": "."},
    "responses": {"type": "message", "role": "user", "content": "."},
}
# The fields of a body a head is read from, per API (the rest is never looked at).
_FIELDS: Mapping[ApiName, tuple[str, ...]] = {
    "chat": ("tools",),
    "anthropic": ("system", "tools", "thinking"),
    "responses": ("instructions", "tools", "reasoning"),
}
_TURNS: Mapping[ApiName, str] = {"chat": "messages", "anthropic": "messages", "responses": "input"}


@dataclass(frozen=True)
class LearnOptions:
    min_sessions: int = DEFAULT_MIN_SESSIONS  # 0: learning off
    ttl: float = DEFAULT_TTL_S  # seconds: the counting window, and a learned prompt's life
    max_prompts: int = DEFAULT_MAX_PROMPTS
    max_bytes: int = DEFAULT_MAX_BYTES
    max_candidates: int = DEFAULT_MAX_CANDIDATES

    @property
    def on(self) -> bool:
        return self.min_sessions > 0


@dataclass
class Head:
    """A request's static head, as its preparation read it."""

    digest: str  # of `api` and `entry`
    api: ApiName
    entry: str  # the warm prompt (without its name) as canonical JSON
    # Set by the table: a session's first request with this head, by which client (the
    # agent its User-Agent names), of which tenant, and whether the head was learned.
    first: bool = False
    client: str = ""
    tenant: str | None = None
    learned: bool = False


def head_of(route: str, body: Mapping[str, Any]) -> Head | None:
    """The static head of a request body on `route` (None: the route has none, or the
    body has nothing static, or not in its API's shape)."""
    api = LEARNED_ROUTES.get(route)
    if api is None:
        return None
    turns = body.get(_TURNS[api])
    if not isinstance(turns, list):
        return None
    leading = []
    for turn in turns:
        if isinstance(turn, Mapping) and turn.get("role") == "user":
            break
        leading.append(turn)
    static = {k: body[k] for k in _FIELDS[api] if k in body}
    static[_TURNS[api]] = [*leading, _PLACEHOLDER[api]]
    try:
        prompt = warm_prompt(api, static, "head")
    except (ValueError, TypeError, KeyError, RecursionError):  # pydantic's errors are ValueErrors
        return None
    entry = prompt.model_dump(mode="json", exclude_none=True, exclude={"name"})
    text = json.dumps(entry, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    if len(text) > MAX_HEAD_BYTES:
        return None
    digest = hashlib.blake2b(f"{api}\n{text}".encode("utf-8", "surrogatepass"), digest_size=16)
    return Head(digest.hexdigest(), api, text)


@dataclass
class _Candidate:
    sessions: dict[bytes, float] = field(default_factory=dict)  # keyed digest -> last sent


@dataclass
class Learned:
    tenant: str | None
    digest: str
    api: ApiName
    client: str  # the agent, as its User-Agent names it (`agent_name`)
    entry: str
    first_seen: float
    last_seen: float
    sessions: int
    first_requests: int = 0
    first_prompt_tokens: int = 0
    first_cached_tokens: int = 0

    @property
    def name(self) -> str:
        return f"{self.client}-{self.digest[:10]}"

    @property
    def size(self) -> int:
        return len(self.entry.encode("utf-8", "surrogatepass"))

    def listed(self) -> dict[str, Any]:
        prompt = {"name": self.name, **json.loads(self.entry)}
        rate = (
            self.first_cached_tokens / self.first_prompt_tokens
            if self.first_prompt_tokens
            else None
        )
        return {
            "name": self.name,
            "tenant": self.tenant,
            "api": self.api,
            "client": self.client,
            "digest": self.digest,
            "bytes": self.size,
            "sessions": self.sessions,
            "first_seen": self.first_seen,
            "last_seen": self.last_seen,
            "first_requests": self.first_requests,
            "first_request_prompt_tokens": self.first_prompt_tokens,
            "first_request_cached_tokens": self.first_cached_tokens,
            "first_request_hit_rate": rate,
            "prompt": prompt,
        }


class LearnedTable:
    def __init__(self, options: LearnOptions | None = None) -> None:
        self.options = options or LearnOptions()
        self._secret = os.urandom(16)
        self._candidates: OrderedDict[tuple[str | None, str], _Candidate] = OrderedDict()
        self._learned: OrderedDict[tuple[str | None, str], Learned] = OrderedDict()
        self._seen: OrderedDict[bytes, None] = OrderedDict()  # (session, head) pairs
        self._bytes = 0
        self.forgotten = 0  # learned prompts dropped (unused for the ttl, or the bounds)

    def __len__(self) -> int:
        return len(self._learned)

    @property
    def size_bytes(self) -> int:
        return self._bytes

    @property
    def candidates(self) -> int:
        return len(self._candidates)

    def observe(
        self,
        head: Head | None,
        session: str | None,
        tenant: str | None,
        user_agent: str = "",
        now: float | None = None,
    ) -> None:
        """A request with `head` from `session` (the tenant's own session key) arrived.
        Marks `head.first` when it is the session's first request with this head."""
        if head is None or session is None or not self.options.on:
            return
        now = time.time() if now is None else now
        self._expire(now)
        key = (tenant, head.digest)
        who = self._digest(f"{session}\n{head.digest}")
        new_session = who not in self._seen
        head.first, head.client, head.tenant = new_session, agent_name(head.api, user_agent), tenant
        self._seen[who] = None
        self._seen.move_to_end(who)
        while len(self._seen) > MAX_SEEN:
            self._seen.popitem(last=False)
        learned = self._learned.get(key)
        if learned is not None:
            learned.last_seen = now
            self._learned.move_to_end(key)
            head.learned = True
            if new_session:
                learned.sessions += 1
            return
        candidate = self._candidates.get(key)
        if candidate is None:
            candidate = self._candidates[key] = _Candidate()
            while len(self._candidates) > self.options.max_candidates:
                self._candidates.popitem(last=False)
        self._candidates.move_to_end(key)
        since = now - self.options.ttl
        sessions = candidate.sessions
        sessions[self._digest(session)] = now
        for old in [s for s, t in sessions.items() if t < since]:
            del sessions[old]
        if len(sessions) >= self.options.min_sessions:
            del self._candidates[key]
            first = min(sessions.values())
            self._learn(
                Learned(tenant, head.digest, head.api, head.client, head.entry, first, now,
                        len(sessions))
            )  # fmt: skip

    def settled(
        self, head: Head | None, prompt_tokens: int | None, cached_tokens: int | None
    ) -> bool:
        """A request observed with `head` ended with this usage: whether it was a
        session's first with its head (counted into its learned prompt's first-request
        hit rate when the head was learned)."""
        if head is None or not head.first or prompt_tokens is None or cached_tokens is None:
            return False
        learned = self._learned.get((head.tenant, head.digest)) if head.learned else None
        if learned is not None:
            learned.first_requests += 1
            learned.first_prompt_tokens += prompt_tokens
            learned.first_cached_tokens += cached_tokens
        return True

    def listing(
        self, tenant: str | None = None, *, every: bool = True, now: float | None = None
    ) -> list[dict[str, Any]]:
        """The learned prompts, most recently used first: every tenant's (`every`), or
        only `tenant`'s (None: an open router's, fleet-wide)."""
        self._expire(time.time() if now is None else now)
        return [
            learned.listed()
            for learned in reversed(self._learned.values())
            if every or learned.tenant == tenant
        ]

    def counts(self) -> dict[str | None, int]:
        """Learned prompts per tenant."""
        counted: dict[str | None, int] = {}
        for learned in self._learned.values():
            counted[learned.tenant] = counted.get(learned.tenant, 0) + 1
        return counted

    def _learn(self, learned: Learned) -> None:
        options = self.options
        if learned.size > options.max_bytes:
            return
        self._learned[(learned.tenant, learned.digest)] = learned
        self._bytes += learned.size
        log.info(
            "learned a warm prompt %s (%s, %s) from %d sessions%s",
            learned.name, learned.api, learned.client, learned.sessions,
            f" of tenant {learned.tenant}" if learned.tenant else "",
        )  # fmt: skip
        while len(self._learned) > options.max_prompts or self._bytes > options.max_bytes:
            self._drop(next(iter(self._learned)), "over the learned prompts' bounds")

    def _expire(self, now: float) -> None:
        """Forget learned prompts unused for the ttl (the least recently used first)."""
        since = now - self.options.ttl
        while self._learned:
            key, oldest = next(iter(self._learned.items()))
            if oldest.last_seen >= since:
                break
            self._drop(key, "unused for the ttl")
        while self._candidates:
            key, candidate = next(iter(self._candidates.items()))
            if max(candidate.sessions.values(), default=0.0) >= since:
                break
            del self._candidates[key]

    def _drop(self, key: tuple[str | None, str], why: str) -> None:
        learned = self._learned.pop(key)
        self._bytes -= learned.size
        self.forgotten += 1
        log.info("forgot the learned warm prompt %s: %s", learned.name, why)

    def _digest(self, text: str) -> bytes:
        return hashlib.blake2b(
            text.encode("utf-8", "surrogatepass"), key=self._secret, digest_size=16
        ).digest()
