"""Key worker processes: a request prepared there equals one prepared in the router, a
layout reaches every worker, a worker that dies costs no request (its requests are
prepared on a thread, and it is started again), and small bodies never leave the
router's process."""

from __future__ import annotations

import json
import os
import signal

import pytest

from support.layouts import tiny_layout
from warmfleet_router.prepare import Invalid, Job, KeyerCache, Prepared, prepare
from warmfleet_router.workers import KeyingPool

pytestmark = pytest.mark.asyncio
BODY = json.dumps(
    {"model": "m", "metadata": {"user_id": "u-1"},
     "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]}
).encode()  # fmt: skip


async def test_workers_prepare_as_the_router_would_and_survive_a_death() -> None:
    layout = tiny_layout()
    job = Job("chat", BODY, (layout.fingerprint,), (("metadata", "user_id"),), 4096)
    pool = KeyingPool(workers=2, large_bytes=0)  # every body is "large": on the workers
    try:
        await pool.start()
        assert await pool.add_layout(layout)
        here = KeyerCache(None)
        here.add(layout)
        expected = prepare(job, here)
        got = await pool.prepare(job)
        assert isinstance(got, Prepared) and isinstance(expected, Prepared)
        assert got.blocks == expected.blocks and got.blocks[layout.fingerprint].keys
        assert (got.model, got.session_values) == ("m", ("u-1",))
        deep = await pool.prepare(Job("chat", b"[" * 50_000 + b"]" * 50_000))
        assert isinstance(deep, Invalid)
        for pid in pool.pids:
            os.kill(pid, signal.SIGKILL)
        again = await pool.prepare(job)  # on a thread, or on a worker started again
        assert isinstance(again, Prepared) and again.blocks == expected.blocks
        later = await pool.prepare(job)
        assert isinstance(later, Prepared) and later.blocks == expected.blocks
        assert len(pool.pids) == 2
    finally:
        await pool.close()


async def test_small_bodies_are_prepared_in_the_router_and_large_ones_on_workers() -> None:
    layout = tiny_layout()
    pool = KeyingPool(workers=1, large_bytes=len(BODY))
    try:
        assert await pool.add_layout(layout)  # loaded here and on the worker
        small = await pool.prepare(Job("chat", BODY, (layout.fingerprint,)))
        assert isinstance(small, Prepared) and small.blocks[layout.fingerprint].keys
        (worker,) = pool._workers
        started = worker.pid
        calls: list[str] = []
        real = worker.call

        async def counted(kind: str, payload: object) -> object:
            calls.append(kind)
            return await real(kind, payload)

        worker.call = counted  # type: ignore[method-assign]
        again = await pool.prepare(Job("chat", BODY, (layout.fingerprint,)))
        assert isinstance(again, Prepared) and again.blocks == small.blocks and calls == []
        large = BODY.replace(b"be brief", b"be brief " * 8)
        keyed = await pool.prepare(Job("chat", large, (layout.fingerprint,)))
        assert isinstance(keyed, Prepared) and calls == ["prepare"] and worker.pid == started
    finally:
        await pool.close()
