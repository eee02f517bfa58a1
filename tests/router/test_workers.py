"""Key worker processes: a request prepared there equals one prepared in the router, a
layout reaches every worker, and a worker that dies costs no request (its requests are
prepared on a thread, and it is started again)."""

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
    pool = KeyingPool(workers=2)
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
