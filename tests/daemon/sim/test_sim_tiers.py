"""The simulated engine's tiers beyond RAM are the real ones (`kvtransfer`) with only the
bytes left out: a block evicted from RAM is read back from the disk tier, and after a
restart too; its size on disk is the profiled machine's to the budget and a hole to the
file system; a new daemon copies a warm set's blocks from a warm peer instead of
prefilling them. Each read takes the profile's time (not asserted: no test times)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from support.processes import Daemon, wait_warm
from support.sim import write_profile

TOKEN = "sim-tiers-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
ENV = {"WARMFLEET_ADMIN_TOKEN": TOKEN}
KV_BYTES_PER_TOKEN = 131072  # support.sim's profile


def ask(url: str, topic: str) -> dict[str, Any]:
    prompt = f"Notes on {topic}: " + " ".join(f"{topic}-{i}" for i in range(700))
    body = {"model": "default", "prompt": prompt, "max_tokens": 2}
    r = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return dict(r.json()["usage"])


def on_disk(tmp_path: Path) -> list[Path]:
    return list((tmp_path / "blocks").rglob("*.safetensors"))


def disk(url: str) -> dict[str, Any]:
    return dict(httpx.get(f"{url}/v1/status", headers=AUTH).json()["disk_tier"])


def test_evicted_blocks_come_back_from_the_disk_tier(
    daemon_factory: Callable[..., Daemon], tmp_path: Path
) -> None:
    profile = write_profile(tmp_path / "mac.json")
    args = (
        "--engine", "sim", "--profile", str(profile), "--sim-speed", "50",
        "--cache-memory-mb", "300", "--cache-dir", str(tmp_path / "blocks"),
        "--cache-disk-mb", "4096", "--no-next-turn-prefill",
    )  # fmt: skip
    first = daemon_factory(*args, env=ENV)
    usage = ask(first.url, "alpha")
    prompt = usage["prompt_tokens"]
    assert prompt > 1000 and usage["prompt_tokens_details"]["cached_tokens"] == 0
    ask(first.url, "beta")  # RAM holds one prompt's blocks: alpha's leave for the disk
    again = ask(first.url, "alpha")
    tiers = again["cached_tokens_by_tier"]
    assert tiers.get("disk", 0) > 0.5 * prompt, tiers
    assert again["prompt_tokens_details"]["cached_tokens"] == sum(tiers.values())

    deadline = time.monotonic() + 30
    while (held := disk(first.url))["queued_blocks"] or len(on_disk(tmp_path)) != held["blocks"]:
        assert time.monotonic() < deadline, (held, on_disk(tmp_path))  # written behind
        time.sleep(0.1)
    assert held["state"] == "on" and held["read_blocks"] > 0
    files = on_disk(tmp_path)
    # The budget counts the profiled machine's bytes; the file system holds headers.
    assert held["bytes"] > held["blocks"] * 32 * KV_BYTES_PER_TOKEN  # (64-token blocks)
    assert sum(os.stat(f).st_blocks * 512 for f in files) < held["bytes"] / 100

    # A restart finds the blocks from their headers and reads them back.
    assert first.stop() == 0
    restarted = daemon_factory(*args, env=ENV)
    back = ask(restarted.url, "alpha")
    assert back["cached_tokens_by_tier"].get("disk", 0) > 0.5 * prompt, back


def test_a_new_daemon_copies_a_warm_set_from_its_peer(
    daemon_factory: Callable[..., Daemon], tmp_path: Path
) -> None:
    profile = write_profile(tmp_path / "mac.json")
    args = ("--engine", "sim", "--profile", str(profile), "--sim-speed", "50")
    system = {"role": "system", "content": "You are the release agent. " * 300}
    body = {"prompts": [{"name": "release", "messages": [system]}]}
    warm = daemon_factory(*args, env=ENV)
    r = httpx.put(f"{warm.url}/v1/warm-sets/ops/agents", json=body, headers=AUTH)
    assert r.status_code == 202, r.text
    wait_warm(warm.url)
    new = daemon_factory(*args, env=ENV)
    r = httpx.put(
        f"{new.url}/v1/warm-sets/ops/agents", json={**body, "peers": [warm.url]}, headers=AUTH
    )
    assert r.status_code == 202, r.text
    wait_warm(new.url)
    held = httpx.get(f"{new.url}/v1/warm-sets/ops/agents", headers=AUTH).json()["prompts"][0]
    assert held["computed_tokens"] == 0 and held["tokens"] > 1000
    status = httpx.get(f"{new.url}/v1/status", headers=AUTH).json()
    assert status["kv_transfer"]["restored_tokens"] == held["tokens"]
