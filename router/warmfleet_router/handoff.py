"""Drain handoff: when a backend drains (its `/readyz` says `draining` after a SIGTERM,
or its WarmNode is deleted), the router asks the backend each of its hottest sessions
will move to, by the policy, to copy that session's blocks from the draining one
(`POST /v1/cache/pull` with the session's block chain), so the session's next request
finds them instead of prefilling its history again.

`HotSessions` is plain data: the block chain of each session's last request and where
it was served, least recently used forgotten first, within a count and a byte budget.
`hand_off` is the I/O, bounded: at most `sessions` sessions, one pull at a time, all
within `seconds` (each pull's own deadline is what is left); past it, the rest are
skipped and the drain goes on without them.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import httpx
from pydantic import ValidationError

from warmfleet_common import bounded
from warmfleet_common.grants import issue_grant
from warmfleet_common.wire import CachePull, CachePullResult, PullBlock
from warmfleet_router.backend import Backend
from warmfleet_router.keys import RequestBlocks
from warmfleet_router.sessions import capped

log = logging.getLogger(__name__)

MAX_HOT_SESSIONS = 4096
DEFAULT_HOT_BUDGET_BYTES = 8 << 20
_ENTRY_OVERHEAD = 300  # the entry, its tuples and the key's str header
_PER_BLOCK = 16 + 40  # a key's bytes and its int end, with their object headers
_RESULT_MAX_BYTES = 4 << 10


@dataclass(frozen=True)
class HotSession:
    key: str
    backend: str
    blocks: RequestBlocks


class HotSessions:
    """Session key -> the blocks of its last request and where it was served."""

    def __init__(
        self, max_sessions: int = MAX_HOT_SESSIONS, budget_bytes: int = DEFAULT_HOT_BUDGET_BYTES
    ) -> None:
        self._max = max_sessions
        self.budget_bytes = budget_bytes
        self._sessions: OrderedDict[str, HotSession] = OrderedDict()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._sessions)

    def served(self, key: str, backend: str, blocks: RequestBlocks) -> None:
        if not blocks.keys:
            return
        key = capped(key)
        old = self._sessions.pop(key, None)
        if old is not None:
            self._bytes -= _cost(old)
        entry = HotSession(key, backend, blocks)
        self._sessions[key] = entry
        self._bytes += _cost(entry)
        while self._sessions and (
            len(self._sessions) > self._max or self._bytes > self.budget_bytes
        ):
            _, gone = self._sessions.popitem(last=False)
            self._bytes -= _cost(gone)

    def on(self, backend: str, limit: int) -> list[HotSession]:
        """The `limit` sessions last served on `backend`, most recent first."""
        out: list[HotSession] = []
        for entry in reversed(self._sessions.values()):
            if len(out) == limit:
                break
            if entry.backend == backend:
                out.append(entry)
        return out

    def moved(self, key: str, backend: str) -> None:
        """Its blocks are on `backend` now (a handoff copied them)."""
        entry = self._sessions.get(key)
        if entry is not None:
            self._sessions[key] = HotSession(key, backend, entry.blocks)


def _cost(entry: HotSession) -> int:
    return _ENTRY_OVERHEAD + len(entry.key) + _PER_BLOCK * len(entry.blocks.keys)


def pull_body(peer: Backend, blocks: RequestBlocks, deadline_s: float) -> CachePull:
    """The pull of `blocks` from `peer`, with a grant to read them when the router holds
    `peer`'s admin token (the target presents it instead of its own token)."""
    starts = (0, *blocks.ends[:-1])
    token = peer.spec.token
    return CachePull(
        peer=peer.url,
        peer_grant=issue_grant(token, peer.url, ttl_s=deadline_s + 60) if token else None,
        blocks=[
            PullBlock(key=k.hex(), start=s, end=e)
            for k, s, e in zip(blocks.keys, starts, blocks.ends)
        ],
        deadline_s=deadline_s,
    )


@dataclass(frozen=True)
class Outcome:
    session: str
    target: str | None
    outcome: str  # copied | failed | skipped
    detail: str = ""
    copied_tokens: int = 0


async def hand_off(
    client: httpx.AsyncClient,
    draining: Backend,
    sessions: list[HotSession],
    target_of: Callable[[HotSession], Backend | None],
    seconds: float,
) -> list[Outcome]:
    """Ask each session's next backend (`target_of`) to pull its blocks from
    `draining`, one session at a time, all within `seconds`."""
    deadline = time.monotonic() + seconds
    out: list[Outcome] = []
    for session in sessions:
        left = deadline - time.monotonic()
        target = target_of(session)
        if target is None:
            out.append(Outcome(session.key, None, "skipped", "no backend to move it to"))
            continue
        if left < 0.5:
            out.append(Outcome(session.key, target.name, "skipped", "the handoff's time is up"))
            continue
        body = pull_body(draining, session.blocks, min(left, 600.0))
        try:
            answer = await bounded.post(
                client,
                f"{target.url}/v1/cache/pull",
                json=body.model_dump(mode="json", exclude_none=True),
                headers=target.admin_headers(),
                limit=_RESULT_MAX_BYTES,
                deadline=left + 2.0,  # the daemon stops at the body's deadline; then answers
            )
            if answer.status != 200:
                text = answer.content[:200].decode(errors="replace")
                out.append(Outcome(session.key, target.name, "failed", f"{answer.status}: {text}"))
                continue
            result = CachePullResult.model_validate_json(answer.content)
        except (httpx.HTTPError, bounded.TooLarge, bounded.TooSlow, ValidationError) as exc:
            out.append(Outcome(session.key, target.name, "failed", f"{type(exc).__name__}: {exc}"))
            continue
        outcome = "copied" if result.complete else "failed"
        detail = f"{result.copied_blocks} block(s) copied, {result.present_blocks} held already"
        out.append(Outcome(session.key, target.name, outcome, detail, result.copied_tokens))
    return out
