"""Shared fixtures. OpenBLAS must be loaded before anything imports mlx."""

from __future__ import annotations

from warmfleet_daemon.support.blas import ensure_fast_blas

ensure_fast_blas()

import pytest  # noqa: E402


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--e2e", action="store_true", help="run the real-cluster e2e suite")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--e2e"):
        return
    skip = pytest.mark.skip(reason="e2e: needs --e2e and a KUBECONFIG")
    for item in items:
        if "e2e" in item.keywords:
            item.add_marker(skip)


# -- models and engines ------------------------------------------------------------

from collections.abc import Callable, Iterator  # noqa: E402

from support.engine import model  # noqa: E402
from support.processes import Daemon, start_daemon  # noqa: E402
from warmfleet_daemon.engine.core import Engine  # noqa: E402
from warmfleet_daemon.engine.requests import EngineConfig  # noqa: E402
from warmfleet_daemon.models.loader import LoadedModel  # noqa: E402


@pytest.fixture(scope="session")
def tiny() -> LoadedModel:
    return model("tiny-random")


@pytest.fixture(scope="session")
def embedded() -> LoadedModel:
    return model("default")


EngineFactory = Callable[..., Engine]


@pytest.fixture
def make_engine() -> EngineFactory:
    """An engine that is stepped on the test thread (not started)."""

    def make(
        loaded: LoadedModel, *, block_size: int = 32, budget: int = 1 << 30, max_num_seqs: int = 16
    ) -> Engine:
        return Engine(loaded, EngineConfig(block_size, budget, max_num_seqs))

    return make


# -- real daemons: `warmfleet serve` in a subprocess on 127.0.0.1, reached over HTTP ---


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
