"""`warmfleet serve --engine sim`: the real daemon (every API, warm sets, status,
metrics) on a simulated forward pass, reached over HTTP with the official SDKs."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from support.processes import Daemon, free_port, wait_warm
from support.sim import write_profile

TOKEN = "sim-admin-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SYSTEM = "You are the fleet's release agent. " + "Check every step twice. " * 120


@pytest.fixture(scope="module")
def sim_daemon(
    daemon_factory: Callable[..., Daemon], tmp_path_factory: pytest.TempPathFactory
) -> Daemon:
    profile = write_profile(tmp_path_factory.mktemp("sim") / "mac.json")
    return daemon_factory(
        "--engine", "sim", "--profile", str(profile), "--sim-speed", "50",
        env={"WARMFLEET_ADMIN_TOKEN": TOKEN},
    )  # fmt: skip


def test_every_api_is_served_and_the_second_request_hits(sim_daemon: Daemon) -> None:
    client = openai.OpenAI(base_url=f"{sim_daemon.url}/v1", api_key="x")
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "ship it"}]
    first = client.chat.completions.create(model="default", messages=messages, max_tokens=8)  # type: ignore[arg-type]
    again = client.chat.completions.create(model="default", messages=messages, max_tokens=8)  # type: ignore[arg-type]
    assert first.model == "test-7b"
    assert first.choices[0].message.content == again.choices[0].message.content
    assert first.usage and first.usage.prompt_tokens_details
    assert again.usage and again.usage.prompt_tokens_details
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert again.usage.prompt_tokens_details.cached_tokens > 0.9 * again.usage.prompt_tokens

    stream = client.chat.completions.create(
        model="default",
        messages=messages,
        max_tokens=8,
        stream=True,  # type: ignore[arg-type]
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)

    claude = anthropic.Anthropic(base_url=sim_daemon.url, api_key="x")
    for _ in range(2):
        reply = claude.messages.create(
            model="default",
            max_tokens=8,
            system=SYSTEM,
            messages=[{"role": "user", "content": "tag the release"}],
        )
    assert reply.content and reply.usage.cache_read_input_tokens

    codex = client.responses.create(
        model="default", instructions=SYSTEM, input="bump the version", max_output_tokens=16
    )
    assert codex.output_text and codex.usage is not None


def test_a_warm_set_makes_the_first_request_hit(sim_daemon: Daemon) -> None:
    system = "You triage pages for the storage team. " * 60
    body = {
        "generation": 1,
        "prompts": [{"name": "triage", "messages": [{"role": "system", "content": system}]}],
    }
    put = httpx.put(f"{sim_daemon.url}/v1/warm-sets/sre/triage", json=body, headers=AUTH)
    assert put.status_code == 202, put.text
    wait_warm(sim_daemon.url)
    client = openai.OpenAI(base_url=f"{sim_daemon.url}/v1", api_key="x")
    first = client.chat.completions.create(
        model="default",
        messages=[{"role": "system", "content": system}, {"role": "user", "content": "disk 4?"}],
        max_tokens=4,
    )
    assert first.usage and first.usage.prompt_tokens_details
    assert first.usage.prompt_tokens_details.cached_tokens > 0.9 * first.usage.prompt_tokens


def test_status_and_metrics_say_it_is_simulated(sim_daemon: Daemon) -> None:
    status = httpx.get(f"{sim_daemon.url}/v1/status").json()
    text = str(status)
    assert "simulated: profile test-mac" in text
    assert status["cache"]["budget_bytes"] == 2 << 30
    # How late the simulation ran, in the profiled Mac's seconds (tests/daemon/sim/
    # test_sim_clock.py checks the figures on a fake clock).
    assert set(status["sim"]) == {"speed", "spent_s", "behind_s", "behind_share"}
    assert status["sim"]["speed"] == 50
    metrics = httpx.get(f"{sim_daemon.url}/metrics").text
    assert "warmfleet_peer_spill_copies" in metrics and "warmfleet_disk_tier" in metrics
    assert "warmfleet_sim_clock_spent_seconds_total" in metrics
    assert "warmfleet_sim_clock_behind_seconds_total" in metrics


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--engine", "sim"], "--engine sim needs --profile"),
        (["--profile", "x.json"], "--profile: only with --engine sim"),
        (["--engine", "sim", "--profile", "no-such-mac"], "no profile named 'no-such-mac'"),
        (["--engine", "sim", "--profile", "PROFILE", "--kv-bits", "8"], "simulate --kv-bits"),
        (
            ["--engine", "sim", "--profile", "PROFILE", "--model", "tiny-random"],
            "--model (the profile names the model)",
        ),
        (
            [
                "--engine",
                "sim",
                "--profile",
                "PROFILE",
                "--nodes",
                "2",
                "--register",
                "mac",
                "--advertise-url",
                "http://127.0.0.1:9",
            ],
            "put {port} where each daemon's port goes",
        ),
        (["--model", "tiny-random", "--nodes", "2"], "--nodes and --first-node only with"),
    ],
)
def test_bad_simulation_flags_stop_serve_at_start(
    args: list[str], says: str, tmp_path: Path
) -> None:
    """Each refused alone (no other flag that would be refused too)."""
    profile = str(write_profile(tmp_path / "mac.json"))
    cmd = [sys.executable, "-m", "warmfleet_cli", "serve", "--port", str(free_port())]
    cmd += [profile if a == "PROFILE" else a for a in args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert says in done.stderr, done.stderr
