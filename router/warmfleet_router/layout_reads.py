"""The router's reads of its daemons' layouts, shared by every backend's sync."""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable

LAYOUT_PATH = "/v1/cache/layout"


class LayoutReads:
    """Which layouts the router holds already, and one whole read of a layout at a time:
    the daemons of one model send their tokenizer's megabytes once, and the rest only
    their costs. (A hundred daemons' whole layouts, parsed at once as they came up, left
    the router's heap 300 MB larger for good.)"""

    def __init__(self, known: Callable[[str], bool]) -> None:
        self.known = known
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()

    def lock(self, fingerprint: str) -> asyncio.Lock:
        lock = self._locks.get(fingerprint)
        if lock is None:
            lock = self._locks[fingerprint] = asyncio.Lock()
        return lock
