"""Real daemons: `warmfleet serve` in a subprocess on 127.0.0.1, reached over HTTP."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from daemons import Daemon, start_daemon


@pytest.fixture(scope="session")
def daemon_factory() -> Iterator[Callable[..., Daemon]]:
    started: list[Daemon] = []

    def factory(*args: str, env: dict[str, str] | None = None) -> Daemon:
        daemon = start_daemon(*args, env=env)
        started.append(daemon)
        return daemon

    yield factory
    for daemon in started:
        daemon.stop()


@pytest.fixture(scope="session")
def tiny_daemon(daemon_factory: Callable[..., Daemon]) -> Daemon:
    return daemon_factory("--model", "tiny-random", "--block-size", "32")


@pytest.fixture(scope="session")
def embedded_daemon(daemon_factory: Callable[..., Daemon]) -> Daemon:
    return daemon_factory("--model", "default")
