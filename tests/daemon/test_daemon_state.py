"""DaemonState's loading thread: the serve command's on-ready hooks run once the daemon
serves, and never after a failed load."""

from __future__ import annotations

import time

from warmfleet_daemon.assembly import DaemonState
from warmfleet_daemon.models.loader import LoadedModel
from warmfleet_daemon.settings import DaemonSettings


def wait_loaded(state: DaemonState) -> None:
    deadline = time.monotonic() + 60
    while state.ready is None and state.load_error is None:
        assert time.monotonic() < deadline, "the model never loaded"
        time.sleep(0.02)


def test_on_ready_hooks_run_once_the_daemon_serves(tiny: LoadedModel) -> None:
    state = DaemonState(DaemonSettings(model="tiny-random"))
    seen: list[bool] = []
    state.on_ready.append(lambda: seen.append(state.ready is not None))
    state.start_loading(loader=lambda _: tiny)
    try:
        wait_loaded(state)
        deadline = time.monotonic() + 10
        while not seen:
            assert time.monotonic() < deadline, "the on-ready hook never ran"
            time.sleep(0.02)
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
        deadline = time.monotonic() + 10
        while not ran:
            assert time.monotonic() < deadline, "the hook after the failing one never ran"
            time.sleep(0.02)
        assert state.ready is not None and state.load_error is None
    finally:
        state.shutdown()
