"""`warmfleet up --engine sim`: the whole fleet (simulated daemons many to a process, the
operator in local mode, the router) as `up` starts it on real models; warm sets reach
every simulated node (the `--warm` one, and the learning one `up` writes) and the first
request through the router is already warm."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import yaml

from support.sim import consecutive_free_ports, write_profile

ROOT = Path(__file__).resolve().parents[2]
NODES = 10


def test_ten_simulated_nodes_warm_and_serve(tmp_path: Path) -> None:
    profile = write_profile(tmp_path / "mac.json")
    port = consecutive_free_ports(NODES + 1)
    log_path = tmp_path / "up.log"
    with log_path.open("wb") as log:
        up = subprocess.Popen(
            [
                sys.executable, "-m", "warmfleet_cli", "up", "--engine", "sim",
                "--profile", str(profile), "--sim-speed", "20", "--nodes", str(NODES),
                "--sim-per-process", "4", "--port", str(port), "--dir", str(tmp_path / "fleet"),
                "--warm", "examples/daemon/warm-prompts.yaml",
            ],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        router = f"http://127.0.0.1:{port}"
        token = _wait_for_token(up, tmp_path / "fleet" / "admin-token", log_path)
        auth = {"Authorization": f"Bearer {token}"}
        deadline = time.monotonic() + 180
        while True:
            assert up.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, log_path.read_text()
            if "warmfleet up: ready" in log_path.read_text():
                backends = httpx.get(f"{router}/v1/router/status", headers=auth).json()["backends"]
                sets = [s for b in backends for s in b["warm_sets"] if s["name"] != "learned"]
                # and `up`'s learning set, empty until the router has learned something
                learning = [s for b in backends for s in b["warm_sets"] if s["name"] == "learned"]
                if len(sets) == NODES and all(s["warm"] == s["total"] == 2 for s in sets):
                    assert all(s["total"] == 0 for s in learning), learning
                    if len(learning) == NODES:
                        break
            time.sleep(0.5)
        text = log_path.read_text()
        assert "simulated      node-1..4 " in text and "node-9..10" in text, text
        oncall = yaml.safe_load((ROOT / "examples/daemon/warm-prompts.yaml").read_text())[0]
        reply = httpx.post(
            f"{router}/v1/chat/completions",
            json={
                "model": "default",
                "max_tokens": 4,
                "messages": [*oncall["messages"], {"role": "user", "content": "pods pending?"}],
                "tools": oncall["tools"],
            },
            timeout=60,
        )
        assert reply.status_code == 200, reply.text
        usage = reply.json()["usage"]  # the first request of all, on whichever node
        assert usage["prompt_tokens_details"]["cached_tokens"] > 0.9 * usage["prompt_tokens"]
    finally:
        up.send_signal(signal.SIGINT)
        code = up.wait(timeout=60)
    text = log_path.read_text()
    assert code == 0 and "Traceback" not in text, text


def _wait_for_token(up: subprocess.Popen[bytes], path: Path, log_path: Path) -> str:
    deadline = time.monotonic() + 30
    while not path.exists():
        assert up.poll() is None, log_path.read_text()
        assert time.monotonic() < deadline
        time.sleep(0.1)
    return path.read_text().strip()
