"""`warmfleet serve --engine sim --nodes N`: N whole simulated daemons in one process,
each on its own port with its own name, cache and metrics; one Ctrl-C stops them all."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import cast

import httpx
import pytest

from support.processes import interrupt
from support.sim import consecutive_free_ports, write_profile
from warmfleet_daemon import fleet_process
from warmfleet_daemon.settings import DaemonSettings


def test_three_daemons_in_one_process(tmp_path: Path) -> None:
    profile = write_profile(tmp_path / "mac.json")
    base = consecutive_free_ports(3)
    log = (tmp_path / "serve.log").open("wb")
    process = subprocess.Popen(
        [
            sys.executable, "-m", "warmfleet_cli", "serve", "--engine", "sim",
            "--profile", str(profile), "--sim-speed", "50", "--nodes", "3",
            "--first-node", "4", "--port", str(base), "--daemon-name", "mac",
            "--log-level", "warning",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        urls = [f"http://127.0.0.1:{base + i}" for i in range(3)]
        deadline = time.monotonic() + 120
        while not all(_ready(u) for u in urls):
            assert process.poll() is None, (tmp_path / "serve.log").read_text()
            assert time.monotonic() < deadline
            time.sleep(0.2)
        body = {"model": "default", "max_tokens": 3, "prompt": "the middle one " * 50}
        for _ in range(2):
            r = httpx.post(f"{urls[1]}/v1/completions", json=body, timeout=60)
        assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
        entries = [httpx.get(f"{u}/v1/status").json()["cache"]["entry_count"] for u in urls]
        assert entries[0] == entries[2] == 0 < entries[1]  # each its own cache
        for i, url in enumerate(urls):
            assert f'daemon="mac-{4 + i}"' in httpx.get(f"{url}/metrics").text
    finally:
        code = interrupt(process)
    assert code == 0, (tmp_path / "serve.log").read_text()
    assert "Traceback" not in (tmp_path / "serve.log").read_text()


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/readyz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_node_control_kills_and_restarts_one_node(tmp_path: Path) -> None:
    """`--node-control stdin`: `kill 2` takes node 2 (and only it) off the network with
    its cache; `start 2` brings it back empty; `stop 1` drains node 1, then it stops."""
    profile = write_profile(tmp_path / "mac.json")
    base = consecutive_free_ports(2)
    log = (tmp_path / "serve.log").open("wb")
    process = subprocess.Popen(
        [
            sys.executable, "-m", "warmfleet_cli", "serve", "--engine", "sim",
            "--profile", str(profile), "--sim-speed", "50", "--nodes", "2",
            "--port", str(base), "--node-control", "stdin", "--drain-seconds", "1",
            "--log-level", "warning",
        ],
        stdin=subprocess.PIPE,
        stdout=log,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    assert process.stdin is not None

    def tell(line: str) -> None:
        assert process.stdin is not None
        process.stdin.write(line.encode() + b"\n")
        process.stdin.flush()

    try:
        one, two = (f"http://127.0.0.1:{base + i}" for i in range(2))
        _wait(lambda: _ready(one) and _ready(two), process, tmp_path)
        body = {"model": "default", "max_tokens": 3, "prompt": "node two's words " * 40}
        httpx.post(f"{two}/v1/completions", json=body, timeout=60)
        assert httpx.get(f"{two}/v1/status").json()["cache"]["entry_count"] > 0
        tell("kill 2")
        _wait(lambda: _refused(two), process, tmp_path)
        assert _ready(one)
        tell("start 2")
        _wait(lambda: _ready(two), process, tmp_path)
        assert httpx.get(f"{two}/v1/status").json()["cache"]["entry_count"] == 0
        tell("stop 1")
        _wait(lambda: httpx.get(f"{one}/readyz").status_code == 503, process, tmp_path)
        _wait(lambda: _refused(one), process, tmp_path)
        assert _ready(two)
        tell("stop 9")  # no such node: said, and nothing changes
        tell("start 1")
        _wait(lambda: _ready(one), process, tmp_path)
    finally:
        code = interrupt(process)
    text = (tmp_path / "serve.log").read_text()
    assert code == 0, text
    assert "expected kill|stop|start NODE" in text
    assert "Traceback" not in text


def _wait(condition: Callable[[], bool], process: subprocess.Popen[bytes], tmp: Path) -> None:
    deadline = time.monotonic() + 120
    while not condition():
        assert process.poll() is None, (tmp / "serve.log").read_text()
        assert time.monotonic() < deadline
        time.sleep(0.1)


def _refused(url: str) -> bool:
    try:
        httpx.get(f"{url}/readyz", timeout=2)
    except httpx.ConnectError:
        return True
    except httpx.HTTPError:
        return False
    return False


def test_the_heap_is_frozen_once_every_node_has_loaded_and_after_each_restart(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Unfrozen, fifty daemons' heaps made full collections long (fleet_process).
    frozen: list[int] = []
    monkeypatch.setattr(fleet_process, "freeze_heap", lambda: frozen.append(1))
    fleet = fleet_process._Fleet(dict.fromkeys((1, 2, 3), cast(DaemonSettings, None)))
    for node in (1, 2):
        fleet._loaded_once(node)
    assert frozen == []
    fleet._loaded_once(3)
    assert frozen == [1]
    fleet._loaded_once(2)  # node 2 restarted: its new daemon's objects too
    assert frozen == [1, 1]
