"""kopf, in process, against kmock's Kubernetes emulator, with real daemons."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

# Short periods for the tests; the handlers read them at import.
os.environ.setdefault("WARMFLEET_RESYNC_SECONDS", "1")
os.environ.setdefault("WARMFLEET_PROBE_SECONDS", "1")
os.environ.setdefault("WARMFLEET_DELETE_RETRIES", "2")

import httpx
import kmock
import pytest
import pytest_asyncio
import yaml

from daemons import Daemon, start_daemon
from kubeemu import RESOURCES, Cluster, Emulator


@pytest_asyncio.fixture
async def cluster(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Cluster]:
    """The emulator, a kubeconfig for it, and kopf running our handlers against it."""
    import kopf

    async with Emulator() as emulator, kmock.Server(emulator):
        for key, info in RESOURCES.items():
            emulator.resources[key] = info
        url = str(emulator.url).rstrip("/")
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "current-context": "kmock",
                    "clusters": [{"name": "kmock", "cluster": {"server": url}}],
                    "users": [{"name": "kmock", "user": {}}],
                    "contexts": [
                        {"name": "kmock", "context": {"cluster": "kmock", "user": "kmock"}}
                    ],
                }
            )
        )
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
                        clusterwide=True, standalone=True, stop_flag=stop, ready_flag=ready
                    )
                )
            except BaseException as exc:  # reported below
                errors.append(exc)

        thread = threading.Thread(target=run, name="kopf", daemon=True)
        thread.start()
        assert await asyncio.to_thread(ready.wait, 30), "kopf did not start"
        async with httpx.AsyncClient(base_url=url, timeout=30) as api:
            yield Cluster(emulator, api)
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
