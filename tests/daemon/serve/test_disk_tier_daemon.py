"""The disk tier in a real `warmfleet serve` (tiny model): a restarted daemon resumes a
session that was never warm from disk (the same tokens, the history cached), and a
read-only cache directory leaves the daemon serving from RAM with the tier off and the
reason in /v1/status."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from support.processes import start_daemon

SESSION: dict[str, Any] = {
    "model": "tiny-random",
    "temperature": 0,
    "max_tokens": 8,
    "messages": [
        {"role": "system", "content": "You are a coding agent. " * 20},
        {"role": "user", "content": "Read the file. " * 30},
        {"role": "assistant", "content": "I read it. " * 30},
        {"role": "user", "content": "Now fix the bug on line 3."},
    ],
}


def chat(url: str) -> dict[str, Any]:
    r = httpx.post(f"{url}/v1/chat/completions", json=SESSION, timeout=60)
    assert r.status_code == 200, r.text
    return dict(r.json())


def test_a_restarted_daemon_resumes_a_session_from_disk(tmp_path: Path) -> None:
    args = ("--model", "tiny-random", "--block-size", "32", "--state-dir", str(tmp_path))
    first = start_daemon(*args)
    try:
        before = chat(first.url)
        status = httpx.get(f"{first.url}/v1/status", timeout=10).json()
        assert status["disk_tier"]["state"] == "on"
        costs = httpx.get(f"{first.url}/v1/cache/layout", timeout=30).json()["costs"]
        assert costs == status["tier_costs"]  # measured once, at start
        hit_us = costs["hit_us_per_token"]
        assert hit_us["disk"] > hit_us["ram"] and costs["kv_bytes_per_token"] > 0
        assert 0 < hit_us["ram"] < costs["prefill_us_per_token"]
    finally:
        assert first.stop() == 0  # a graceful stop writes what the disk lacks
    assert any((tmp_path / "kv-cache").rglob("*.safetensors"))

    second = start_daemon(*args)
    try:
        snapshot = httpx.get(f"{second.url}/v1/cache/snapshot", timeout=30).json()
        tiers = {b["tier"] for b in snapshot["blocks"]}
        assert tiers == {"disk"} and len(snapshot["blocks"]) >= 3  # before any request
        assert all(b["on_disk"] and b["tiers"] == ["disk"] for b in snapshot["blocks"])
        after = chat(second.url)
        # Read back into RAM, still on disk: a RAM eviction leaves them disk blocks.
        snapshot = httpx.get(f"{second.url}/v1/cache/snapshot", timeout=30).json()
        in_ram = [b for b in snapshot["blocks"] if b["tier"] == "ram"]
        assert in_ram and any(b["on_disk"] for b in in_ram)
        assert {tuple(b["tiers"]) for b in in_ram} <= {("ram",), ("ram", "disk")}
        status = httpx.get(f"{second.url}/v1/status", timeout=10).json()
    finally:
        second.stop()
    assert after["choices"][0]["message"] == before["choices"][0]["message"]
    prompt = after["usage"]["prompt_tokens"]
    cached = after["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= prompt - 32  # all but the last block at most
    tiers = after["usage"]["cached_tokens_by_tier"]  # where they came from: the disk
    assert tiers["disk"] > 0 and tiers["ram"] + tiers["disk"] == cached
    assert status["disk_tier"]["read_blocks"] > 0


def test_a_read_only_cache_dir_leaves_the_daemon_serving(tmp_path: Path) -> None:
    where = tmp_path / "ro"
    where.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(where)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip("mounting a tmpfs needs root (CI and the dev machines are)")
    try:
        daemon = start_daemon("--model", "tiny-random", "--cache-dir", str(where))
        try:
            assert chat(daemon.url)["choices"][0]["finish_reason"] in ("stop", "length")
            tier = httpx.get(f"{daemon.url}/v1/status", timeout=10).json()["disk_tier"]
            assert tier["state"] == "off" and "Read-only" in tier["error"]
            costs = httpx.get(f"{daemon.url}/v1/status", timeout=10).json()["tier_costs"]
            assert "disk" not in costs["hit_us_per_token"]  # no disk tier to read from
            assert "disk tier is off" in daemon.log()
        finally:
            daemon.stop()
    finally:
        subprocess.run(["umount", str(where)], check=False)
