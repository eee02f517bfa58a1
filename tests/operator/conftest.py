"""kopf, in process, against kmock's Kubernetes emulator, with real daemons."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import pytest_asyncio

from support.kubeemu import Cluster, emulated
from support.processes import Daemon, start_daemon
from warmfleet_operator.config import OperatorConfig

# Short periods for the tests.
FAST = OperatorConfig(resync_seconds=1, probe_seconds=1, delete_retries=2)


@pytest_asyncio.fixture
async def cluster(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Cluster]:
    """The emulator, a kubeconfig for it, and kopf running our handlers against it."""
    import kopf

    async with emulated(tmp_path) as (api, kubeconfig):
        monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
        import warmfleet_operator.handlers  # noqa: F401  (registers the handlers once)

        # kopf owns its event loop (it cancels tasks it did not start when it stops),
        # so it runs in a thread with a loop of its own, as in production.
        stop, ready = threading.Event(), threading.Event()
        errors: list[BaseException] = []

        def run() -> None:
            try:
                asyncio.run(
                    kopf.operator(
                        clusterwide=True,
                        standalone=True,
                        stop_flag=stop,
                        ready_flag=ready,
                        memo=kopf.Memo(config=FAST),
                    )
                )
            except BaseException as exc:  # reported below
                errors.append(exc)

        thread = threading.Thread(target=run, name="kopf", daemon=True)
        thread.start()
        assert await asyncio.to_thread(ready.wait, 30), "kopf did not start"
        yield api
        stop.set()
        await asyncio.to_thread(thread.join, 60)
        assert not thread.is_alive(), "kopf did not stop"
        assert not errors, errors


@pytest.fixture(scope="module")
def daemons() -> Iterator[list[Daemon]]:
    """Three real daemons on the tiny model."""
    started = [start_daemon("--model", "tiny-random", "--block-size", "32") for _ in range(3)]
    yield started
    for daemon in started:
        daemon.stop()
