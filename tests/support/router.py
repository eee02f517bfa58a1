"""The router under test: real tiny-random daemons with a real router in front of them
(processes on 127.0.0.1, read with the fleet's admin token), and the router's Fleet in
process over fake backends (httpx.MockTransport)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import ExitStack, asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from support.processes import Daemon, start_daemon, start_router
from warmfleet_router.fleet import Fleet
from warmfleet_router.metrics import RouterMetrics
from warmfleet_router.options import RouterOptions

TOKEN = "fleet-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@contextmanager
def tiny_daemons(*args: str, tokens: Sequence[str]) -> Iterator[list[Daemon]]:
    """One tiny-random daemon (blocks of 32) per admin token in `tokens`, started with
    `args`; all stopped on exit."""
    with ExitStack() as stack:
        started = []
        for token in tokens:
            daemon = start_daemon(
                "--model", "tiny-random", "--block-size", "32", *args,
                env={"WARMFLEET_ADMIN_TOKEN": token},
            )  # fmt: skip
            stack.callback(daemon.stop)
            started.append(daemon)
        yield started


def start_router_for(daemons: Sequence[Daemon], folder: Path, *args: str) -> Daemon:
    """`warmfleet router` in front of `daemons` with the admin token TOKEN (its file in
    `folder`) and `args`, once its /readyz says a backend is ready."""
    token_file = folder / "token"
    token_file.write_text(TOKEN + "\n")
    backends = [arg for d in daemons for arg in ("--backend", d.url)]
    return start_router(*backends, "--admin-token-file", str(token_file), *args)


def status(router: Daemon) -> dict[str, Any]:
    """The router's full status (/v1/router/status, read with TOKEN)."""
    return httpx.get(f"{router.url}/v1/router/status", headers=AUTH, timeout=10).json()


def wait_for(condition: Callable[[], Any], timeout: float = 30.0) -> None:
    """Returns once `condition()` is true; fails the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def wait_following(router: Daemon, backends: int, timeout: float = 60.0) -> None:
    """Returns once the router follows the cache events of all its `backends` backends."""
    deadline = time.monotonic() + timeout
    while [b["index"]["mode"] for b in status(router)["backends"]] != ["following"] * backends:
        if time.monotonic() > deadline:
            log = router.log() if router.process is not None else ""
            pytest.fail(f"the router never followed every daemon's events: {status(router)}\n{log}")
        time.sleep(0.1)


@asynccontextmanager
async def mocked_fleet(
    options: RouterOptions, backends: Callable[[httpx.Request], Any]
) -> AsyncIterator[Fleet]:
    """A router Fleet whose backends `backends` answers (httpx.MockTransport); closed,
    with its metrics, on exit."""
    metrics = RouterMetrics()
    async with httpx.AsyncClient(transport=httpx.MockTransport(backends)) as client:
        fleet = Fleet(options, client, metrics)
        try:
            yield fleet
        finally:
            await fleet.close()
            metrics.shutdown()
