"""Prefixes a request asked to keep (Anthropic's `cache_control`): their blocks pinned in
the prefix cache for a time (5 minutes or an hour), renewed by every use, within the
pin budget that warm sets share; unpinned when the time is up (a thread checks every
second, so the status tells the truth within seconds)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from warmfleet_common.chunking import BlockKey
from warmfleet_daemon.cache.prefix_cache import BlockView, PrefixCache
from warmfleet_daemon.support.background import BackgroundThread

_CHECK_EVERY_S = 1.0


@dataclass
class _Hold:
    expires: float
    epoch: int  # the cache's clear count when pinned: a clear drops every pin


class TimedPins:
    def __init__(
        self,
        cache: PrefixCache[Any],
        allowed_bytes: Callable[[], int],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._cache = cache
        self._allowed = allowed_bytes
        self._clock = clock
        self._held: dict[tuple[BlockKey, ...], _Hold] = {}
        self._lock = threading.Lock()
        self._worker = BackgroundThread("warmfleet-pins", self._lock)
        # Counted by the cache's listener, under the cache's lock: never take ours there.
        self._clears = 0
        cache.listeners.append(self._on_change)

    def start(self) -> None:
        self._worker.start(self._run)

    def stop(self) -> None:
        self._worker.stop()

    def hold(self, keys: Sequence[BlockKey], ttl_s: float) -> bool:
        """Keep the chain `keys` (root first) pinned for `ttl_s` more seconds. False
        when a block is not stored or pinning it would pass the pin budget (the blocks
        then stay in the cache as any others, least-recently-used)."""
        chain = tuple(keys)
        if not chain:
            return False
        with self._lock:
            self._expire()
            expires = self._clock() + ttl_s
            held = self._held.get(chain)
            if held is not None:
                held.expires = max(held.expires, expires)
                return True
            epoch = self._clears
            extra = self._cache.pinned_bytes_of(chain)
            if extra and self._cache.stats.pinned_bytes + extra > self._allowed():
                return False
            if not self._cache.pin(chain):
                return False
            self._held[chain] = _Hold(expires, epoch)
            return True

    def held(self) -> int:
        """Prefixes pinned right now."""
        with self._lock:
            self._expire()
            return len(self._held)

    def _on_change(self, kind: str, _: BlockView[Any] | None) -> None:
        if kind == "cleared":
            self._clears += 1

    def _expire(self) -> None:
        now = self._clock()
        for chain, held in list(self._held.items()):
            if held.epoch != self._clears:
                del self._held[chain]  # cleared with the cache: nothing left to unpin
            elif held.expires <= now:
                self._cache.unpin(chain)
                del self._held[chain]

    def _run(self) -> None:
        with self._lock:
            while not self._worker.stopping:
                self._expire()
                self._worker.wake.wait(timeout=_CHECK_EVERY_S)
