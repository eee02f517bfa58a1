"""Warm prompts on real daemons: the start-up file, the push API with a token,
persistence across a restart, and refusing to start unprotected."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from support.processes import serve_refusal, wait_warm

SYSTEM = {"role": "system", "content": "You are Pager, the incident commander's assistant. " * 10}
TOKEN = "integration-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def ask(url: str, question: str, model: str = "tiny-random") -> dict:
    body = {
        "model": model,
        "messages": [SYSTEM, {"role": "user", "content": question}],
        "max_tokens": 4,
        "temperature": 0,
    }
    r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def test_warm_prompts_file_at_start_up(daemon_factory, tmp_path) -> None:
    path = tmp_path / "agents.json"
    path.write_text(json.dumps([[SYSTEM]]))  # vllm-mlx's format
    daemon = daemon_factory(
        "--model", "tiny-random", "--warm-prompts", str(path), "--log-level", "info"
    )
    wait_warm(daemon.url)
    warm = httpx.get(f"{daemon.url}/v1/warm-sets/local/warm-prompts").json()
    assert warm["prompts"][0]["name"] == "prompt-1" and warm["warm"] == 1
    usage = ask(daemon.url, "Who is on call?")["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] == warm["prompts"][0]["tokens"]
    deadline = time.monotonic() + 10
    while "Warm-up done (strict-prefix): 1 completed" not in daemon.log():
        assert time.monotonic() < deadline, daemon.log()
        time.sleep(0.1)


def test_pushed_sets_survive_a_restart_with_state_dir(daemon_factory, tmp_path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    state = tmp_path / "state"
    args = (
        "--model",
        "tiny-random",
        "--state-dir",
        str(state),
        "--admin-token-file",
        str(token_file),
    )
    first = daemon_factory(*args)
    body = {"generation": 3, "prompts": [{"name": "pager", "messages": [SYSTEM]}]}
    assert (
        httpx.put(f"{first.url}/v1/warm-sets/ops/pager", json=body, headers=AUTH).status_code == 202
    )
    wait_warm(first.url)
    assert first.stop() == 0

    second = daemon_factory(*args)
    wait_warm(second.url)  # nobody pushed: it came back from the state directory
    sets = httpx.get(f"{second.url}/v1/warm-sets", headers=AUTH).json()["sets"]
    assert [(s["namespace"], s["name"], s["generation"], s["warm"]) for s in sets] == [
        ("ops", "pager", 3, 1)
    ]
    cached = ask(second.url, "Status?")["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached == sets[0]["prompts"][0]["tokens"]


def test_a_corrupt_state_file_is_reported_and_ignored(daemon_factory, tmp_path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "warm-sets.json").write_text('{"version": 1, "sets": [{"namespace": "ops", "na')
    daemon = daemon_factory("--model", "tiny-random", "--state-dir", str(state))
    assert httpx.get(f"{daemon.url}/v1/warm-sets").json()["sets"] == []
    assert "starting without saved warm sets" in daemon.log()
    assert [p.name for p in state.glob("warm-sets.json.unreadable-*")]  # kept aside
    ask(daemon.url, "still serving?")


def test_refuses_to_listen_beyond_loopback_without_a_token() -> None:
    done = serve_refusal("--host", "0.0.0.0")
    assert done.returncode == 2
    assert "without an admin token" in done.stderr


def test_a_bad_warm_prompts_file_fails_fast(tmp_path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("- name: x\n  messages: []\n")
    done = serve_refusal("--warm-prompts", str(path))
    assert done.returncode == 2 and "invalid warm prompts" in done.stderr


@pytest.mark.embedded
def test_embedded_model_warm_daemon_matches_a_cold_one(daemon_factory, tmp_path) -> None:
    tools = [
        {
            "type": "function",
            "function": {
                "name": "page_oncall",
                "description": "Page the on-call engineer",
                "parameters": {"type": "object", "properties": {"team": {"type": "string"}}},
            },
        }
    ]
    few_shot = [
        SYSTEM,
        {"role": "user", "content": "Sev2 in payments?"},
        {"role": "assistant", "content": "Page payments on-call, open a bridge."},
    ]
    entries = {
        "single": ([SYSTEM], None),
        "tools": ([SYSTEM], tools),
        "few-shot": (few_shot, None),
    }
    path = tmp_path / "prompts.yaml"
    path.write_text(
        json.dumps(
            [
                {"name": n, "messages": m, **({"tools": t} if t else {})}
                for n, (m, t) in entries.items()
            ]
        )
    )
    warm = daemon_factory("--model", "default", "--warm-prompts", str(path))
    cold = daemon_factory("--model", "default", "--cache-memory-mb", "0")
    wait_warm(warm.url)
    tokens = {
        p["name"]: p["tokens"]
        for p in httpx.get(f"{warm.url}/v1/warm-sets/local/warm-prompts").json()["prompts"]
    }
    for name, (history, tool_list) in entries.items():
        body = {
            "model": "default",
            "messages": [
                *history,
                {"role": "user", "content": "The API is returning 500s. What first?"},
            ],
            "max_tokens": 24,
            "temperature": 0,
        }
        if tool_list:
            body["tools"] = tool_list
        got = httpx.post(f"{warm.url}/v1/chat/completions", json=body, timeout=120).json()
        want = httpx.post(f"{cold.url}/v1/chat/completions", json=body, timeout=120).json()
        assert got["usage"]["prompt_tokens_details"]["cached_tokens"] == tokens[name], name
        assert want["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        assert (
            got["choices"][0]["message"]["content"] == want["choices"][0]["message"]["content"]
        ), name
