"""`warmfleet sim replay`: a short trace's sessions replayed closed-loop against two
simulated daemons in one process; every step is served, each session's later steps
read their conversation from the cache, and a trace longer than the fleet's context is
refused before anything is sent."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from support.processes import interrupt
from support.sim import consecutive_free_ports, write_profile

SPEED = "240"  # the trace's compression: a working day in two minutes


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    folder = tmp_path_factory.mktemp("replay")
    profile = write_profile(folder / "mac.json", context_length=32768)
    port = consecutive_free_ports(1)
    log = (folder / "serve.log").open("wb")
    process = subprocess.Popen(
        [
            sys.executable, "-m", "warmfleet_cli", "serve", "--engine", "sim",
            "--profile", str(profile), "--sim-speed", SPEED, "--nodes", "1",
            "--port", str(port), "--log-level", "warning",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        assert process.poll() is None, (folder / "serve.log").read_text()
        assert time.monotonic() < deadline
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    yield url
    interrupt(process)


def trace(path: Path, *extra: str) -> Path:
    subprocess.run(
        [
            sys.executable, "-m", "warmfleet_cli", "sim", "trace", "--developers", "3",
            "--compress", SPEED, "--out", str(path), *extra,
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return path


def test_sessions_replay_and_continue_from_the_cache(fleet: str, tmp_path: Path) -> None:
    path = trace(tmp_path / "t.jsonl", "--context-tokens", "32768")
    rows = tmp_path / "rows.jsonl"
    done = subprocess.run(
        [
            sys.executable, "-m", "warmfleet_cli", "sim", "replay", str(path), "--url", fleet,
            "--sessions", "2", "--out", str(rows),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["failed"] == 0 and result["sessions"] == 2
    outcomes = [json.loads(line) for line in rows.read_text().splitlines()]
    assert len(outcomes) == result["requests"] > 3
    later = [o for o in outcomes if o["turn"] > 0 and o["kind"] == "tool"]
    assert later and all(o["cached_tokens"] > 0.5 * o["prompt_tokens"] for o in later)
    assert all(o["ttft_s"] is not None and o["ttft_s"] > 0 for o in outcomes)
    assert "rolling-restart at trace second" in done.stderr  # said, not silently skipped


def test_a_trace_longer_than_the_fleet_serves_is_refused(fleet: str, tmp_path: Path) -> None:
    path = trace(tmp_path / "t.jsonl")  # 65,536 tokens: more than the profile's 32,768
    done = subprocess.run(
        [sys.executable, "-m", "warmfleet_cli", "sim", "replay", str(path), "--url", fleet],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert "--context-tokens 32768" in done.stderr
