"""Warm without prefill on real daemons: a restart reloads its warm blocks from
`--state-dir`, a new daemon copies them from a warm peer (`--warm-from`, or the peers
named in a push), and each answers exactly like a daemon that computed everything."""

from __future__ import annotations

import json
import time

import httpx

from support.processes import Daemon, wait_warm

SYSTEM = {"role": "system", "content": "You are Relay, the on-call handover assistant. " * 14}
TOKEN = "kv-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
QUESTION = "Who holds the pager tonight?"


def ask(url: str) -> tuple[str, int]:
    body = {
        "model": "tiny-random",
        "messages": [SYSTEM, {"role": "user", "content": QUESTION}],
        "max_tokens": 12,
        "temperature": 0,
    }
    r = httpx.post(f"{url}/v1/chat/completions", json=body, headers=AUTH, timeout=120)
    assert r.status_code == 200, r.text
    doc = r.json()
    return doc["choices"][0]["message"]["content"], doc["usage"]["prompt_tokens_details"][
        "cached_tokens"
    ]


def status(daemon: Daemon) -> dict:
    return httpx.get(f"{daemon.url}/v1/status", headers=AUTH).json()


def warm_prompt(daemon: Daemon, namespace: str, name: str) -> dict:
    r = httpx.get(f"{daemon.url}/v1/warm-sets/{namespace}/{name}", headers=AUTH)
    return r.json()["prompts"][0]


def test_restart_and_peers_warm_without_prefill(daemon_factory, tmp_path) -> None:
    (tmp_path / "token").write_text(TOKEN)
    (tmp_path / "agents.json").write_text(json.dumps([{"name": "relay", "messages": [SYSTEM]}]))
    common = ("--model", "tiny-random", "--block-size", "32", "--log-level", "info")
    common += ("--admin-token-file", str(tmp_path / "token"))
    # The reference: the first request on a daemon that never saw this prompt.
    reference = daemon_factory(*common)
    expected, cached = ask(reference.url)
    assert cached == 0

    warm_args = (*common, "--warm-prompts", str(tmp_path / "agents.json"))
    first = daemon_factory(*warm_args, "--state-dir", str(tmp_path / "state"))
    wait_warm(first.url)
    tokens = warm_prompt(first, "local", "warm-prompts")["tokens"]
    deadline = time.monotonic() + 30
    while not (status(first)["kv_transfer"]["snapshots"] or {}).get("files"):
        assert time.monotonic() < deadline, status(first)["kv_transfer"]
        time.sleep(0.1)

    # A new daemon told to warm from the first one computes nothing.
    copy = daemon_factory(*warm_args, "--warm-from", first.url)
    wait_warm(copy.url)
    assert warm_prompt(copy, "local", "warm-prompts")["computed_tokens"] == 0
    assert status(copy)["kv_transfer"]["restored_tokens"] == tokens
    assert ask(copy.url) == (expected, tokens)

    # The operator's way: the peers named in the push.
    pushed = daemon_factory(*common)
    body = {"prompts": [{"name": "relay", "messages": [SYSTEM]}], "peers": [first.url]}
    r = httpx.put(f"{pushed.url}/v1/warm-sets/ops/relay", json=body, headers=AUTH)
    assert r.status_code == 202, r.text
    wait_warm(pushed.url)
    assert warm_prompt(pushed, "ops", "relay")["computed_tokens"] == 0
    assert ask(pushed.url) == (expected, tokens)

    # A restart reloads the snapshots before prefilling anything.
    assert first.stop() == 0
    again = daemon_factory(*warm_args, "--state-dir", str(tmp_path / "state"))
    wait_warm(again.url)
    assert warm_prompt(again, "local", "warm-prompts")["computed_tokens"] == 0
    assert status(again)["kv_transfer"]["snapshots"]["restored"] > 0
    assert "Restored" in again.log() and "from disk" in again.log()
    assert ask(again.url) == (expected, tokens)


def test_the_blocks_route_refuses_bad_requests(daemon_factory, tmp_path) -> None:
    (tmp_path / "token").write_text(TOKEN)
    daemon = daemon_factory("--model", "tiny-random", "--admin-token-file", str(tmp_path / "token"))
    url = f"{daemon.url}/v1/cache/blocks"
    assert httpx.get(url, params={"keys": "00" * 16}).status_code == 401
    info = httpx.get(f"{daemon.url}/v1/cache/fingerprint", headers=AUTH).json()
    r = httpx.get(url, params={"keys": "00" * 16, "fingerprint": "f" * 32}, headers=AUTH)
    assert r.status_code == 409 and r.json()["error"]["param"] == "fingerprint"
    r = httpx.get(url, params={"keys": "xyz"}, headers=AUTH)
    assert r.status_code == 400 and r.json()["error"]["param"] == "keys"
    r = httpx.get(url, params={"keys": "00" * 16, "fingerprint": info["fingerprint"]}, headers=AUTH)
    assert r.status_code == 200 and r.content == b""  # not stored: an empty stream
    r = httpx.put(
        f"{daemon.url}/v1/warm-sets/ops/x",
        json={"prompts": [{"name": "a", "messages": [SYSTEM]}], "peers": ["ftp://nope"]},
        headers=AUTH,
    )
    assert r.status_code in (400, 422) and "peers" in r.text
