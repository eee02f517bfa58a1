"""Where requests are prepared (parsed, checked, keyed: `prepare`), never on the
router's event loop. Bodies up to `large_bytes` (256 KiB: prompts of up to ~60k tokens)
on a thread of the router process; larger ones in key worker processes (`worker.py`),
so a few huge prompts never hold the router's GIL for seconds. A handoff to another
process cost more CPU than keying a 1k-token prompt itself (a context switch and four
pipe transfers per request: bench/router_overhead.py, docs/PERFORMANCE.md), so the
common case stays in the process. The event loop talks to each worker over its stdin
and stdout (framed pickles, in order), with no thread in between; a large body goes to
the worker with the fewest jobs waiting (its session's worker, unless that one is
busier). Layouts reach the workers as files in a private
directory, and every worker (and the router's own threads) builds a layout's keyer when
it arrives. A worker that dies is started again, and its requests are prepared on a
thread meanwhile. `workers=0` prepares everything on threads (a router that must stay
one process).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import logging
import os
import pickle
import shutil
import sys
import tempfile
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from warmfleet_common.cache_layout import CacheLayout
from warmfleet_router.prepare import Invalid, Job, KeyerCache, Prepared, prepare

log = logging.getLogger(__name__)

DEFAULT_LARGE_BYTES = 256 << 10
_STICKY_SLACK = 2
_HEADER = 8
T = TypeVar("T")


class WorkerGone(Exception):
    pass


class _Worker:
    def __init__(self, name: str, directory: Path) -> None:
        self.name = name
        self._directory = directory
        self._process: asyncio.subprocess.Process | None = None
        self._pending: deque[asyncio.Future[Any]] = deque()
        self._reader: asyncio.Task[None] | None = None
        self._starting: asyncio.Lock = asyncio.Lock()
        self._stopping = False

    @property
    def waiting(self) -> int:
        return len(self._pending)

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    async def start(self) -> None:
        async with self._starting:
            if self._process is not None and self._process.returncode is None:
                return
            self._process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "warmfleet_router.worker", str(self._directory),
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            )  # fmt: skip
            self._reader = asyncio.create_task(self._read(self._process), name=self.name)

    async def call(self, kind: str, payload: Any) -> Any:
        if self._process is None or self._process.returncode is not None:
            await self.start()
        process = self._process
        assert process is not None and process.stdin is not None
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        # A body goes after its job, not inside its pickle: no copy of a large body more.
        raw = payload.raw if isinstance(payload, Job) else b""
        if raw:
            payload = dataclasses.replace(payload, raw=b"")
        data = pickle.dumps((kind, payload), protocol=pickle.HIGHEST_PROTOCOL)
        self._pending.append(future)
        try:
            process.stdin.write(len(data).to_bytes(_HEADER, "big"))
            process.stdin.write(data)
            process.stdin.write(len(raw).to_bytes(_HEADER, "big"))
            process.stdin.write(raw)
            await process.stdin.drain()
        except (ConnectionError, RuntimeError) as exc:
            raise WorkerGone(f"{self.name}: {exc}") from exc
        return await future

    async def _read(self, process: asyncio.subprocess.Process) -> None:
        assert process.stdout is not None
        try:
            while True:
                header = await process.stdout.readexactly(_HEADER)
                data = await process.stdout.readexactly(int.from_bytes(header, "big"))
                future = self._pending.popleft()
                if not future.done():  # its request may have left
                    future.set_result(pickle.loads(data))
        except (asyncio.IncompleteReadError, ConnectionError, IndexError) as exc:
            code = await process.wait()
            if not self._stopping:
                log.warning("key worker %s exited (%s, code %s); started again on demand",
                            self.name, type(exc).__name__, code)  # fmt: skip
            while self._pending:
                future = self._pending.popleft()
                if not future.done():
                    future.set_exception(WorkerGone(f"{self.name} exited with code {code}"))

    async def stop(self) -> None:
        self._stopping = True
        process = self._process
        if process is None:
            return
        if process.stdin is not None:
            process.stdin.close()
        try:
            await asyncio.wait_for(process.wait(), 5)
        except asyncio.TimeoutError:
            process.kill()
            await process.wait()
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader


class KeyingPool:
    def __init__(self, workers: int = 0, large_bytes: int = DEFAULT_LARGE_BYTES) -> None:
        self._directory = Path(tempfile.mkdtemp(prefix="warmfleet-router-layouts-"))
        self._large_bytes = large_bytes
        self._local = KeyerCache(self._directory)  # the router's own threads
        # Two: one large body on a thread (no workers) does not queue every small one.
        self._threads = ThreadPoolExecutor(max_workers=2, thread_name_prefix="key-thread")
        self.workers = workers
        self._workers = [_Worker(f"key-worker-{i}", self._directory) for i in range(workers)]
        self.usable: dict[str, bool] = {}  # fingerprint -> a keyer could be built
        self._adding: dict[str, asyncio.Lock] = {}

    @property
    def pids(self) -> list[int]:
        return [w.pid for w in self._workers if w.pid is not None]

    async def start(self) -> None:
        """Start the workers now (else on first use)."""
        await asyncio.gather(*(w.start() for w in self._workers))

    async def add_layout(self, layout: CacheLayout) -> bool:
        """Make a layout available to the threads and every worker; whether it is usable
        for keys."""
        async with self._adding.setdefault(layout.fingerprint, asyncio.Lock()):
            if layout.fingerprint not in self.usable:
                self.usable[layout.fingerprint] = await self._add(layout)
        return self.usable[layout.fingerprint]

    async def _add(self, layout: CacheLayout) -> bool:
        path = self._directory / f"{layout.fingerprint}.json"
        await asyncio.to_thread(_write_atomically, path, layout.model_dump_json())
        here = self._on_thread(self._local.get, layout.fingerprint)
        try:
            loaded = await asyncio.gather(
                here, *(w.call("load", layout.fingerprint) for w in self._workers)
            )
        except WorkerGone:
            return await self._on_thread(self._local.get, layout.fingerprint) is not None
        return loaded[0] is not None and all(loaded[1:])

    async def prepare(self, job: Job) -> Prepared | Invalid:
        if self._workers and len(job.raw) > self._large_bytes:
            worker = self._worker_for(job)
            try:
                answer = await worker.call("prepare", job)
            except WorkerGone as exc:
                log.warning("preparing a request on a thread: %s", exc)
            else:
                if isinstance(answer, (Prepared, Invalid)):
                    return answer
        return await self._on_thread(prepare, job, self._local)

    def _worker_for(self, job: Job) -> _Worker:
        """A session's worker (its memo of the session's last request is there:
        `turn_memo`) unless others wait for fewer jobs by more than `_STICKY_SLACK`; else
        the worker with the fewest jobs waiting."""
        idle = min(self._workers, key=lambda w: w.waiting)
        if job.session is None:
            return idle
        digest = hashlib.blake2b(job.session.encode("utf-8", "surrogatepass"), digest_size=8)
        own = self._workers[int.from_bytes(digest.digest(), "big") % len(self._workers)]
        return own if own.waiting <= idle.waiting + _STICKY_SLACK else idle

    def _on_thread(self, function: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        return asyncio.get_running_loop().run_in_executor(self._threads, function, *args)

    async def close(self) -> None:
        await asyncio.gather(*(w.stop() for w in self._workers), return_exceptions=True)
        self._threads.shutdown(wait=False, cancel_futures=True)
        shutil.rmtree(self._directory, ignore_errors=True)


def _write_atomically(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)
