"""`warmfleet sim replay`: a short trace's sessions replayed closed-loop through the
router of `warmfleet up --engine sim --nodes 3`; every step is served, each session's
later steps on its node read their conversation from the cache, and a trace
longer than the fleet's context is refused before anything is sent."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from support.processes import interrupt
from support.sim import consecutive_free_ports, write_profile

SPEED = "240"  # the trace's compression: a working day in two minutes
NODES = 3


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`warmfleet up --engine sim --nodes 3`: the router, the local operator and three
    simulated daemons in one process; yields the router's URL."""
    folder = tmp_path_factory.mktemp("replay")
    # Room for every session's conversation: what this test checks is that they are
    # found where they are, not how the cache evicts (the sim daemon tests do that).
    profile = write_profile(folder / "mac.json", context_length=32768, memory_gib=64)
    port = consecutive_free_ports(NODES + 1)
    log_path = folder / "up.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [
                sys.executable, "-m", "warmfleet_cli", "up", "--engine", "sim",
                "--profile", str(profile), "--sim-speed", SPEED, "--nodes", str(NODES),
                "--sim-per-process", str(NODES), "--port", str(port),
                "--dir", str(folder / "fleet"),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    deadline = time.monotonic() + 180
    while "warmfleet up: ready" not in log_path.read_text():
        assert process.poll() is None, log_path.read_text()
        assert time.monotonic() < deadline, log_path.read_text()
        time.sleep(0.3)
    yield f"http://127.0.0.1:{port}"
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
            "--sessions", str(2 * NODES), "--out", str(rows),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["failed"] == 0 and result["sessions"] == 2 * NODES
    outcomes = [json.loads(line) for line in rows.read_text().splitlines()]
    assert len(outcomes) == result["requests"] > 3
    # Through the router: a session's next turn goes to the node holding its conversation
    # and reads it from the cache there. The bounded load may send one elsewhere when
    # every session sits on one node (the policy at work, not a miss): those are left out.
    previous: dict[str, dict[str, Any]] = {}
    stayed: list[dict[str, Any]] = []
    moved: list[dict[str, Any]] = []
    for o in sorted(outcomes, key=lambda o: (o["session"], o["turn"])):
        before = previous.get(o["session"])
        previous[o["session"]] = o
        if before is None or o["kind"] != "tool":
            continue
        (stayed if o["node"] == before["node"] else moved).append(o)
    assert all(o["node"] is not None for o in outcomes)
    cold = [o for o in stayed if o["cached_tokens"] <= 0.5 * o["prompt_tokens"]]
    assert stayed and not cold, [(o["session"], o["turn"], o["node"]) for o in cold]
    assert len(moved) <= len(stayed), [(o["session"], o["turn"], o["reason"]) for o in moved]
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


def test_a_messages_prompt_counts_what_was_read_created_and_computed() -> None:
    """Anthropic's usage splits a prompt three ways; a first request whose head was cold
    reports most of it as cache_creation_input_tokens (computed up to its breakpoint):
    counting only input + read made a cold 13k-token first request read as 515 tokens,
    514 of them cached."""
    from warmfleet_cli.sim.replay import Outcome, _read_usage

    outcome = Outcome("s", 0, "claude-code", "2.1", 0, "user", 0.0)
    usage = {"input_tokens": 1, "cache_creation_input_tokens": 13_000,
             "cache_read_input_tokens": 514, "output_tokens": 8}  # fmt: skip
    _read_usage({"type": "message_delta", "usage": usage}, outcome)
    assert (outcome.prompt_tokens, outcome.cached_tokens) == (13_515, 514)
    responses = {"input_tokens": 900, "input_tokens_details": {"cached_tokens": 800}}
    _read_usage({"type": "response.completed", "response": {"usage": responses}}, outcome)
    assert (outcome.prompt_tokens, outcome.cached_tokens) == (900, 800)
