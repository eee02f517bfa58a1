"""`warmfleet operator --local DIR`: the same reconcile core over a folder of YAML
files, against real daemons (one of them behind an admin token)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from support.processes import Daemon, start_daemon

TOKEN = "local-mode-token"


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Any:
    token = tmp_path_factory.mktemp("token") / "token"
    token.write_text(TOKEN)
    daemon = start_daemon("--model", "tiny-random", "--admin-token-file", str(token))
    yield daemon
    daemon.stop()


def write(folder: Path, name: str, *docs: dict[str, Any]) -> None:
    (folder / name).write_text(yaml.safe_dump_all(docs))


def wait_status(path: Path, check: Any, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    last: dict[str, Any] = {}
    while time.monotonic() < deadline:
        if path.exists():
            last = json.loads(path.read_text())
            if check(last):
                return last
        time.sleep(0.2)
    raise AssertionError(f"status never matched: {json.dumps(last)[:2000]}")


def ready(status: dict[str, Any], key: str) -> bool:
    conds = (status["warmPromptSets"].get(key) or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)


def test_local_mode_reconciles_a_folder(
    tmp_path: Path, daemons: list[Daemon], guarded: Daemon
) -> None:
    plain = daemons[0]
    write(
        tmp_path,
        "nodes.yaml",
        {
            "apiVersion": "warmfleet.io/v1alpha1",
            "kind": "WarmNode",
            "metadata": {"name": "mini-1", "labels": {"pool": "home"}},
            "spec": {"url": plain.url},
        },
        {
            "apiVersion": "warmfleet.io/v1alpha1",
            "kind": "WarmNode",
            "metadata": {"name": "mini-2", "labels": {"pool": "home"}},
            "spec": {
                "url": guarded.url,
                "adminTokenSecretRef": {"name": "daemon-token", "key": "token"},
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "daemon-token"},
            "stringData": {"token": TOKEN},
        },
    )
    prompts = [
        {"name": "home", "messages": [{"role": "system", "content": "You run the house. " * 10}]}
    ]
    wps = {
        "apiVersion": "warmfleet.io/v1alpha1",
        "kind": "WarmPromptSet",
        "metadata": {"name": "assistant"},
        "spec": {"nodeSelector": {"matchLabels": {"pool": "home"}}, "prompts": prompts},
    }
    write(tmp_path, "assistant.yaml", wps)
    status_file = tmp_path / "status.json"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "warmfleet_cli",
            "operator",
            "--local",
            str(tmp_path),
            "--status-file",
            str(status_file),
            "--resync-seconds",
            "1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        status = wait_status(status_file, lambda s: ready(s, "default/assistant"))
        entry = status["warmPromptSets"]["default/assistant"]
        assert entry["warmNodes"] == "2/2"
        assert status["warmNodes"]["mini-2"]["reachable"] is True
        for d in (plain, guarded):
            r = httpx.get(
                f"{d.url}/v1/warm-sets/default/assistant",
                headers={"Authorization": f"Bearer {TOKEN}"},
            )
            assert r.json()["warm"] == 1

        # an edit is picked up without a restart
        before = httpx.get(f"{plain.url}/v1/warm-sets/default/assistant").json()["content_hash"]
        time.sleep(1.1)  # the file's mtime stands in for the generation
        prompts[0]["messages"][0]["content"] += "Lights off at 23:00."
        write(tmp_path, "assistant.yaml", wps)

        def rewarmed(_: dict[str, Any]) -> bool:
            got = httpx.get(f"{plain.url}/v1/warm-sets/default/assistant").json()
            return got["content_hash"] != before and got["warm"] == 1

        wait_status(status_file, rewarmed)

        # removing the file removes the set from the daemons
        (tmp_path / "assistant.yaml").unlink()
        wait_status(status_file, lambda s: "default/assistant" not in s["warmPromptSets"])
        deadline = time.monotonic() + 30
        while httpx.get(f"{plain.url}/v1/warm-sets/default/assistant").status_code != 404:
            assert time.monotonic() < deadline
            time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert "WarmPromptSet default/assistant: Ready=True AllWarm" in out
    assert "WarmPromptSet default/assistant: removed" in out


def test_the_operators_liveness_endpoint_is_loopback_unless_asked() -> None:
    import argparse

    from warmfleet_operator.cli import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert parser.parse_args([]).liveness.startswith("http://127.0.0.1:")


def test_a_node_joining_a_warm_pool_copies_the_blocks_from_its_peer(tmp_path: Path) -> None:
    """The operator names the warm node as the joining node's peer: the newcomer copies
    its KV blocks (one admin token for both, as the chart has it) and prefills nothing."""
    (tmp_path / "token").write_text(TOKEN)
    args = ("--model", "tiny-random", "--block-size", "32", "--log-level", "info")
    args += ("--admin-token-file", str(tmp_path / "token"))
    warm, joining = start_daemon(*args), start_daemon(*args)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    folder = tmp_path / "fleet"
    folder.mkdir()
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "daemon-token"},
        "stringData": {"token": TOKEN},
    }

    def node(name: str, daemon: Daemon) -> dict[str, Any]:
        return {
            "apiVersion": "warmfleet.io/v1alpha1",
            "kind": "WarmNode",
            "metadata": {"name": name, "labels": {"pool": "home"}},
            "spec": {
                "url": daemon.url,
                "adminTokenSecretRef": {"name": "daemon-token", "key": "token"},
            },
        }

    system = {"role": "system", "content": "You keep the greenhouse log. " * 12}
    wps = {
        "apiVersion": "warmfleet.io/v1alpha1",
        "kind": "WarmPromptSet",
        "metadata": {"name": "greenhouse"},
        "spec": {
            "nodeSelector": {"matchLabels": {"pool": "home"}},
            "prompts": [{"name": "log", "messages": [system]}],
        },
    }
    write(folder, "set.yaml", wps)
    write(folder, "nodes.yaml", secret, node("mini-1", warm))
    status_file = tmp_path / "status.json"
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "warmfleet_cli", "operator", "--local", str(folder)),
            *("--status-file", str(status_file), "--resync-seconds", "1"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_status(status_file, lambda s: ready(s, "default/greenhouse"))
        write(folder, "nodes.yaml", secret, node("mini-1", warm), node("mini-2", joining))

        def both_warm(s: dict[str, Any]) -> bool:
            entry = s["warmPromptSets"].get("default/greenhouse") or {}
            return ready(s, "default/greenhouse") and entry.get("warmNodes") == "2/2"

        wait_status(status_file, both_warm, timeout=120)
        held = httpx.get(f"{joining.url}/v1/warm-sets/default/greenhouse", headers=auth).json()
        assert held["warm"] == 1 and held["prompts"][0]["computed_tokens"] == 0
        transfer = httpx.get(f"{joining.url}/v1/status", headers=auth).json()["kv_transfer"]
        assert transfer["restored_blocks"] > 0
        assert transfer["restored_tokens"] == held["prompts"][0]["tokens"]
        assert "0 block(s) from disk" in joining.log()
        first = httpx.get(f"{warm.url}/v1/status", headers=auth).json()["kv_transfer"]
        assert first["restored_blocks"] == 0  # it had no peer: it prefilled
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
        warm.stop()
        joining.stop()
    assert proc.returncode == 0, out


def test_local_mode_says_nothing_of_daemons_that_are_still_starting(capsys) -> None:
    from warmfleet_operator.local import StatusNews

    starting = StatusNews(grace_s=60)
    starting.node("node-1", False, "ConnectError: refused")  # loading its model
    starting.warm_set("default/agents", {"status": "False", "reason": "NodesUnreachable"}, "0/1")
    starting.node("node-1", True, None)  # reached: all is well, no news
    starting.warm_set("default/agents", {"status": "True", "reason": "AllWarm"}, "1/1")
    starting.node("node-1", False, "ConnectError: refused")  # it was up: news
    assert capsys.readouterr().out.splitlines() == [
        "WarmPromptSet default/agents: Ready=True AllWarm (1/1 nodes warm) ",
        "WarmNode node-1: reachable=False ConnectError: refused",
    ]

    late = StatusNews(grace_s=0)  # past the start: a node never reached is news
    late.node("node-2", False, "ConnectError: refused")
    late.node("node-2", False, "ConnectError: refused")
    late.warm_set("default/agents", {"status": "False", "reason": "NodesUnreachable"}, "0/1")
    assert capsys.readouterr().out.splitlines() == [
        "WarmNode node-2: reachable=False ConnectError: refused",
        "WarmPromptSet default/agents: Ready=False NodesUnreachable (0/1 nodes warm) ",
    ]
