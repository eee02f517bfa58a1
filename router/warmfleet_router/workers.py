"""Where requests are prepared (parsed, checked, keyed: `prepare`): worker processes,
so no request's JSON or tokenizing ever runs on the router's event loop or holds its
GIL. Two lanes: bodies over `large_bytes` have a worker of their own, so a few huge
prompts never queue the small ones behind them. Layouts reach the workers as files in
a private directory (each worker builds a keyer on first use, and every worker is asked
to build it when the layout arrives). `workers=0` prepares on threads of the router
process instead (tests, and a router that must stay one process).
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import shutil
import tempfile
from concurrent.futures import Executor, ProcessPoolExecutor
from pathlib import Path

from warmfleet_common.cache_layout import CacheLayout
from warmfleet_router.prepare import Invalid, Job, KeyerCache, Prepared, prepare

log = logging.getLogger(__name__)

DEFAULT_LARGE_BYTES = 256 << 10

_cache: KeyerCache | None = None  # a worker process's keyers


def _start_worker(directory: str) -> None:
    global _cache
    _cache = KeyerCache(Path(directory))


def _run(job: Job) -> Prepared | Invalid:
    assert _cache is not None
    return prepare(job, _cache)


def _load(fingerprint: str) -> bool:
    """Build a layout's keyer now (True: usable)."""
    assert _cache is not None
    return _cache.get(fingerprint) is not None


class KeyingPool:
    def __init__(self, workers: int = 0, large_bytes: int = DEFAULT_LARGE_BYTES) -> None:
        self._directory = Path(tempfile.mkdtemp(prefix="warmfleet-router-layouts-"))
        self._large_bytes = large_bytes
        self._local = KeyerCache(self._directory) if workers <= 0 else None
        self._pools: list[Executor] = []
        if workers > 0:
            # Spawned, not forked: the router has threads (OpenTelemetry, the event loop's
            # executors) that a fork would copy mid-state.
            context = multiprocessing.get_context("spawn")
            for count in (max(1, workers - 1), 1):  # small lane, large lane
                self._pools.append(
                    ProcessPoolExecutor(
                        count,
                        mp_context=context,
                        initializer=_start_worker,
                        initargs=(str(self._directory),),
                    )
                )
        self.workers = workers
        self.usable: dict[str, bool] = {}  # fingerprint -> a keyer could be built
        self._adding: dict[str, asyncio.Lock] = {}

    async def add_layout(self, layout: CacheLayout) -> bool:
        """Make a layout available to every worker; whether it is usable for keys."""
        async with self._adding.setdefault(layout.fingerprint, asyncio.Lock()):
            if layout.fingerprint not in self.usable:
                self.usable[layout.fingerprint] = await self._add(layout)
        return self.usable[layout.fingerprint]

    async def _add(self, layout: CacheLayout) -> bool:
        path = self._directory / f"{layout.fingerprint}.json"
        text = layout.model_dump_json()
        await asyncio.to_thread(_write_atomically, path, text)
        if self._local is not None:
            ok = await asyncio.to_thread(self._local.get, layout.fingerprint) is not None
        else:
            loop = asyncio.get_running_loop()
            loads = [
                loop.run_in_executor(pool, _load, layout.fingerprint)
                for pool in self._pools
                for _ in range(_size(pool))
            ]  # one each, most likely: a worker that got none builds it on first use
            ok = all(await asyncio.gather(*loads))
        return ok

    async def prepare(self, job: Job) -> Prepared | Invalid:
        if self._local is not None:
            return await asyncio.to_thread(prepare, job, self._local)
        pool = self._pools[1] if len(job.raw) > self._large_bytes else self._pools[0]
        return await asyncio.get_running_loop().run_in_executor(pool, _run, job)

    def close(self) -> None:
        for pool in self._pools:
            pool.shutdown(wait=False, cancel_futures=True)
        shutil.rmtree(self._directory, ignore_errors=True)


def _size(pool: Executor) -> int:
    return int(getattr(pool, "_max_workers", 1))


def _write_atomically(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)
