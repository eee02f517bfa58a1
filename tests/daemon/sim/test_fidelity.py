"""The simulated engine's fidelity (issue 35): one trace's requests replayed against a
real daemon on the embedded model and against a simulated daemon with this machine's
measured profile get the same cached tokens, request by request.

The requests are the replay's own (`warmfleet_cli.sim.bodies`: Claude Code's Messages,
Codex's Responses, with tool calls and results, a compaction and the request after it),
from a hand-written trace of three short sessions; every reply carried forward is the
trace's fixed text, not an engine's answer, so both daemons get byte-identical requests
(bench/sim_fidelity.py says why, and measures TTFT on the agents' full requests). The
agents' 10k-token heads are cut to a few hundred tokens (every text longer than
TEXT_CAP characters cut, two tools kept) so the embedded model prefills them in seconds.

Nothing here depends on wall-clock speed (TTFT is the bench's): the requests go one at
a time, each once the daemon is idle (its next-turn prefill done), and the simulated
daemon runs 50x faster than the profile.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from support.processes import Daemon, start_daemon
from warmfleet_cli.sim.bodies import SessionBodies

pytestmark = pytest.mark.embedded

PROFILE = "linux-x86-2core-smollm2-135m-f32"
TEXT_CAP = 240  # characters: the agents' heads cut to a few hundred tokens
BLOCK = 32  # small blocks: many block boundaries inside every message


def _step(session: str, turn: int, kind: str, **fields: Any) -> dict[str, Any]:
    agent = "codex" if session == "C" else "claude-code"
    version = "0.171.0" if agent == "codex" else "2.1.332"
    dev = {"A": 0, "B": 1, "C": 2}[session]
    record = {"dev": dev, "agent": agent, "version": version, "session": f"session-{session}"}
    return {**record, "turn": turn, "kind": kind, "out": 40, "calls": 0, **fields}


# Sessions A and B (Claude Code, two developers: the same head) and C (Codex), interleaved
# as a trace's would be: first requests, later turns, tool results, a compaction and the
# request after it (the head again, the summary, the words).
TRACE = [
    _step("A", 0, "user", user=30, calls=1),
    _step("C", 0, "user", user=25, calls=2),
    _step("A", 1, "tool", results=[80], calls=1),
    _step("B", 0, "user", user=12),
    _step("C", 1, "tool", results=[50, 20]),
    _step("A", 2, "tool", results=[30]),
    _step("B", 1, "user", user=20),
    _step("A", 3, "user", user=15),
    _step("C", 2, "user", user=40),
    _step("A", 4, "compact", out=60),
    _step("A", 5, "resume", user=10),
    _step("B", 2, "user", user=20),
]


def bodies() -> list[tuple[str, dict[str, str], dict[str, Any]]]:
    """Each step's request as the replay builds it with fixed replies, cut to size, one
    answer token, not streamed."""
    builders: dict[str, SessionBodies] = {}
    out = []
    for step in TRACE:
        request = builders.setdefault(step["session"], SessionBodies()).request(step)
        body = copy.deepcopy(request.body)
        body["tools"] = body["tools"][:2]
        body = _capped(body)
        body["max_tokens" if "max_tokens" in body else "max_output_tokens"] = 1
        body |= {"stream": False, "temperature": 0.0}
        out.append((request.path, request.headers, body))
    return out


def _capped(value: Any) -> Any:
    """Every string cut to TEXT_CAP characters (what was shared stays shared)."""
    if isinstance(value, str):
        return value[:TEXT_CAP]
    if isinstance(value, list):
        return [_capped(v) for v in value]
    if isinstance(value, dict):
        return {k: _capped(v) for k, v in value.items()}
    return value


@dataclass(frozen=True)
class Served:
    prompt: int
    cached: int


@dataclass(frozen=True)
class Replayed:
    served: list[Served]
    cache: dict[str, Any]  # /v1/status's cache figures at the end


def settle(url: str, timeout: float = 60) -> None:
    """Until nothing runs on the daemon, its next-turn prefill included."""
    deadline = time.monotonic() + timeout
    while True:
        status = httpx.get(f"{url}/v1/status").json()
        engine, pending = status["engine"], (status.get("next_turn") or {}).get("pending", 0)
        busy = ("running", "prefilling", "waiting", "idle_waiting")
        if not pending and not any(engine[k] for k in busy):
            return
        assert time.monotonic() < deadline, status
        time.sleep(0.05)


def replay(daemon: Daemon) -> Replayed:
    try:
        return _replay(daemon)
    finally:
        daemon.stop()


def _replay(daemon: Daemon) -> Replayed:
    served = []
    with httpx.Client(base_url=daemon.url, timeout=120) as client:
        for path, headers, body in bodies():
            settle(daemon.url)
            response = client.post(path, headers=headers, json=body)
            assert response.status_code == 200, response.text
            usage = response.json()["usage"]
            if "cache_read_input_tokens" in usage:  # Messages: the three add up to the prompt
                cached = usage["cache_read_input_tokens"]
                prompt = usage["input_tokens"] + usage["cache_creation_input_tokens"] + cached
            else:  # Responses
                prompt, cached = (
                    usage["input_tokens"],
                    usage["input_tokens_details"]["cached_tokens"],
                )
            served.append(Served(prompt, cached))
        settle(daemon.url)
        cache = client.get("/v1/status").json()["cache"]
    return Replayed(served, cache)


def replayed(*options: str) -> Iterator[tuple[Replayed, Replayed]]:
    """The trace on a real daemon, then on a simulated one (one at a time: a real
    prefill is CPU-bound), both with `options`."""
    real = replay(start_daemon("--model", "default", *options))
    sim = replay(
        start_daemon("--engine", "sim", "--profile", PROFILE, "--sim-speed", "50", *options)
    )
    yield real, sim


SAME = ("--block-size", str(BLOCK), "--max-context", "4096")


@pytest.fixture(scope="module")
def default_config() -> Iterator[tuple[Replayed, Replayed]]:
    """The daemons as they start by default: next-turn prefill on; a budget that holds
    the whole trace (the answers differ, so would the bytes of their next turns)."""
    yield from replayed(*SAME, "--cache-memory-mb", "1024")


@pytest.fixture(scope="module")
def evicting() -> Iterator[tuple[Replayed, Replayed]]:
    """A budget of a few hundred tokens' KV, so later requests evict earlier blocks;
    without next-turn prefill, so what is stored is the prompts' blocks alone, the same
    on both (a block weighs the profile's bytes on one, the model's on the other)."""
    yield from replayed(*SAME, "--cache-memory-mb", "40", "--no-next-turn-prefill")


def test_the_same_requests_hit_the_same_tokens(
    default_config: tuple[Replayed, Replayed],
) -> None:
    real, sim = default_config
    assert [s.prompt for s in sim.served] == [s.prompt for s in real.served]
    assert [s.cached for s in sim.served] == [s.cached for s in real.served]
    # Not a trivial trace: first requests miss (Codex's shares the template's first
    # chunk with Claude Code's), the second developer's hits Claude Code's head, later
    # turns hit their session, and some requests hit partly.
    cached = [s.cached for s in real.served]
    assert cached[0] == 0 and cached[1] < BLOCK
    assert 0 < cached[3] < real.served[3].prompt
    assert all(c > 0 for c in cached[2:])
    assert any(0 < s.cached < s.prompt - 8 for s in real.served)
    assert real.cache["evictions"] == sim.cache["evictions"] == 0
    assert sim.cache["hit_tokens"] == real.cache["hit_tokens"]


def test_evictions_too(evicting: tuple[Replayed, Replayed]) -> None:
    real, sim = evicting
    assert [s.cached for s in sim.served] == [s.cached for s in real.served]
    assert real.cache["evictions"] > 0
    figures = ("bytes", "entry_count", "evictions", "evicted_bytes", "hit_tokens")
    assert {k: sim.cache[k] for k in figures} == {k: real.cache[k] for k in figures}
