"""DaemonState's loading thread: the serve command's on-ready hooks run once the daemon
serves, and never after a failed load."""

from __future__ import annotations

import time
from collections.abc import Callable

from warmfleet_daemon.models.loader import LoadedModel
from warmfleet_daemon.runtime.assembly import DaemonState
from warmfleet_daemon.settings import DaemonSettings


def wait_for(done: Callable[[], object], what: str, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not done():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def wait_loaded(state: DaemonState) -> None:
    wait_for(lambda: state.ready is not None or state.load_error is not None, "never loaded")


def test_on_ready_hooks_run_once_the_daemon_serves(tiny: LoadedModel) -> None:
    state = DaemonState(DaemonSettings(model="tiny-random"))
    seen: list[bool] = []
    state.on_ready.append(lambda: seen.append(state.ready is not None))
    state.start_loading(loader=lambda _: tiny)
    try:
        wait_loaded(state)
        wait_for(lambda: seen, "the on-ready hook never ran", 10)
        assert seen == [True]
        assert state.load_error is None
    finally:
        state.shutdown()


def test_a_failed_load_runs_no_hook() -> None:
    def broken(name: str) -> LoadedModel:
        raise FileNotFoundError(f"no model {name}")

    state = DaemonState(DaemonSettings(model="missing"))
    ran: list[str] = []
    state.on_ready.append(lambda: ran.append("hook"))
    state.start_loading(loader=broken)
    wait_loaded(state)
    assert state.load_error == "FileNotFoundError: no model missing"
    assert state.ready is None
    time.sleep(0.1)
    assert ran == []


def test_a_failing_hook_leaves_the_daemon_serving(tiny: LoadedModel) -> None:
    def broken() -> None:
        raise RuntimeError("hook bug")

    state = DaemonState(DaemonSettings(model="tiny-random"))
    ran: list[str] = []
    state.on_ready += [broken, lambda: ran.append("next")]
    state.start_loading(loader=lambda _: tiny)
    try:
        wait_loaded(state)
        wait_for(lambda: ran, "the hook after the failing one never ran", 10)
        assert state.ready is not None and state.load_error is None
    finally:
        state.shutdown()
