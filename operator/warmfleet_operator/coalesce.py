"""Bursts of triggers turned into one pass."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable


class Coalesced:
    """Runs a pass once, `delay` after the first trigger of a burst, and once more if
    triggered while it ran. kopf gives each object a shallow copy of the memo, so this
    mutable holder is what the handlers of all WarmNodes share."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self._pending = False
        self._task: asyncio.Task[None] | None = None

    def trigger(self, run: Callable[[], Awaitable[None]]) -> None:
        self._pending = True
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._loop(run))

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _loop(self, run: Callable[[], Awaitable[None]]) -> None:
        while self._pending:
            await asyncio.sleep(self.delay)
            self._pending = False
            await run()
