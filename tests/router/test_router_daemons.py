"""A real router in front of three real tiny-random daemons, driven by the `openai` and
`anthropic` clients: prefix routing from the daemons' cache events (predicted cached
tokens equal the daemons' own) for chat, Anthropic Messages and Responses requests, warm
sets spreading a shared system prompt, streaming passed through, session affinity (the
agents' own session ids too), failover before the first byte and an error event after
it."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest.mock import ANY

import anthropic
import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from support.processes import Daemon, start_daemon
from support.promql import dashboard_queries, metric_names
from support.router import AUTH, TOKEN, start_router_for, status, tiny_daemons, wait_following

SYSTEM = {
    "role": "system",
    "content": "You are Relay, the incident commander's assistant. Keep answers short. " * 6,
}


@pytest.fixture(scope="module")
def daemons() -> Iterator[list[Daemon]]:
    with tiny_daemons(tokens=[TOKEN] * 3) as started:
        yield started


@pytest.fixture(scope="module")
def router(daemons: list[Daemon], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    # Slow active checks: the failover tests exercise the passive ones.
    r = start_router_for(daemons, tmp_path_factory.mktemp("router"), "--health-interval", "30")
    wait_following(r, 3)
    yield r
    r.stop()


@pytest.fixture(scope="module")
def client(router: Daemon) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{router.url}/v1", api_key="unused", max_retries=0)


def name_of(daemon: Daemon) -> str:
    return daemon.url.removeprefix("http://")


def ask(client: openai.OpenAI, messages: list[dict[str, str]], **kw: Any) -> tuple[Any, str, str]:
    raw = client.chat.completions.with_raw_response.create(
        model="default", messages=messages, temperature=0, max_tokens=8, **kw
    )
    return raw.parse(), raw.headers["x-warmfleet-backend"], raw.headers["x-warmfleet-route-reason"]


def last_decision(router: Daemon) -> dict[str, Any]:
    # Recorded when the response ends, a moment after the client has it.
    for _ in range(50):
        decisions = status(router)["decisions"]
        if decisions:
            return decisions[0]
        time.sleep(0.05)
    raise AssertionError("no decision recorded")


def wait_for_events(router: Daemon, seconds: float = 0.5) -> None:
    time.sleep(seconds)  # the daemons' events reach the router within milliseconds


def test_a_router_is_ready_only_with_its_backends_indexed(
    daemons: list[Daemon], tmp_path: Path
) -> None:
    # Its first request is keyed by the daemons' blocks (their tokenizers loaded), not
    # routed by history while the index catches up.
    fresh = start_router_for(daemons[:1], tmp_path)
    try:
        (backend,) = status(fresh)["backends"]
        assert backend["index"]["mode"] == "following"
        assert backend["index"]["layout"]
    finally:
        fresh.stop()


def test_models_and_readiness(router: Daemon, client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list().data] == ["tiny-random"]
    assert httpx.get(f"{router.url}/readyz").json()["status"] == "ready"
    body = status(router)
    assert body["policy"] == "prefix" and len(body["backends"]) == 3
    assert all(b["health"] == "ready" and b["index"]["layout"] for b in body["backends"])


def test_a_conversation_follows_its_history_and_predictions_are_exact(
    router: Daemon, client: openai.OpenAI
) -> None:
    history = [SYSTEM]
    backends = []
    for turn in range(4):
        history.append(
            {"role": "user", "content": f"Turn {turn}: what is the status of INC-{turn}?"}
        )
        r, backend, reason = ask(client, history)
        history.append({"role": "assistant", "content": r.choices[0].message.content or ""})
        decision = last_decision(router)
        assert decision["predicted_cached_tokens"] == r.usage.prompt_tokens_details.cached_tokens
        backends.append(backend)
        if turn:
            assert reason == "prefix"
            assert r.usage.prompt_tokens_details.cached_tokens > 0
        wait_for_events(router)
    assert len(set(backends)) == 1, backends


def test_a_warm_set_on_every_daemon_spreads_new_sessions(
    router: Daemon, daemons: list[Daemon], client: openai.OpenAI
) -> None:
    system = {"role": "system", "content": "You are Ledger, the finance team's agent. " * 10}
    spec = {"generation": 1, "prompts": [{"name": "ledger", "messages": [system]}]}
    for d in daemons:
        r = httpx.put(f"{d.url}/v1/warm-sets/team/ledger", json=spec, headers=AUTH, timeout=30)
        assert r.status_code == 202, r.text
    for d in daemons:
        deadline = time.monotonic() + 60
        while httpx.get(f"{d.url}/readyz", params={"warm": 1}).status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.1)
    wait_for_events(router)
    for d in daemons:  # the blocks a warm set lists are the ones the daemon holds
        sets = httpx.get(f"{d.url}/v1/warm-sets", headers=AUTH).json()["sets"]
        listed = next(s for s in sets if s["name"] == "ledger")["prompts"][0]["blocks"]
        snapshot = httpx.get(f"{d.url}/v1/cache/snapshot", headers=AUTH).json()
        assert listed and set(listed) <= {b["key"] for b in snapshot["blocks"]}
    used = set()
    for i in range(9):
        r, backend, reason = ask(client, [system, {"role": "user", "content": f"Invoice {i}?"}])
        assert reason == "prefix"
        assert r.usage.prompt_tokens_details.cached_tokens > 0  # warm everywhere
        used.add(backend)
    assert len(used) >= 2, used
    # The router reads warm sets through the daemons' admin route every 10 s.
    expected = {"namespace": "team", "name": "ledger", "warm": 1, "total": 1, "pin": True}
    deadline = time.monotonic() + 15
    while not all(expected in b["warm_sets"] for b in status(router)["backends"]):
        assert time.monotonic() < deadline, status(router)["backends"]
        time.sleep(0.5)


def test_streaming_passes_chunks_through_with_usage(router: Daemon, client: openai.OpenAI) -> None:
    messages = [SYSTEM, {"role": "user", "content": "Stream me a short status line."}]
    raw = client.chat.completions.with_raw_response.create(
        model="default",
        messages=messages,
        temperature=0,
        max_tokens=16,
        stream=True,
        stream_options={"include_usage": True},
    )
    assert raw.headers["content-type"].startswith("text/event-stream")
    backend = raw.headers["x-warmfleet-backend"]
    chunks = list(raw.parse())
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    usage = chunks[-1].usage
    assert text and usage is not None and usage.completion_tokens == 16
    assert usage.prompt_tokens_details.cached_tokens > 0  # the system prompt is cached
    decision = last_decision(router)
    assert decision["backend"] == backend
    assert decision["cached_tokens"] == usage.prompt_tokens_details.cached_tokens
    assert decision["predicted_cached_tokens"] == decision["cached_tokens"]
    # The same answer as without the router (greedy).
    direct = openai.OpenAI(base_url=f"http://{backend}/v1", api_key="unused", max_retries=0)
    again = direct.chat.completions.create(
        model="default", messages=messages, temperature=0, max_tokens=16
    )
    assert again.choices[0].message.content == text


def test_the_session_header_keeps_a_session_on_one_backend(
    router: Daemon, client: openai.OpenAI
) -> None:
    picks = []
    for i in range(4):
        # Unrelated contents: only the header ties them together.
        _, backend, reason = ask(
            client,
            [{"role": "user", "content": f"Unrelated question number {i} " * (i + 1)}],
            extra_headers={"x-session-affinity": "user-7"},
        )
        picks.append((backend, reason))
    assert len({b for b, _ in picks}) == 1
    assert [r for _, r in picks[1:]] == ["session"] * 3


# -- the agents' APIs: Anthropic Messages (Claude Code) and Responses (Codex) -----------

AGENT_SYSTEM = "You are Forge, a coding agent for a Go monorepo. Keep answers short. " * 6
GREEDY = {"temperature": 0}  # the current anthropic SDK takes no temperature argument


def test_anthropic_messages_follow_their_prefix_with_exact_predictions(router: Daemon) -> None:
    """The official `anthropic` SDK through the router: a conversation stays where its
    blocks are, and the router predicts exactly what the daemon reads from its cache."""
    client = anthropic.Anthropic(base_url=router.url, api_key="unused", max_retries=0)
    history: list[dict[str, Any]] = []
    backends = []
    for turn in range(3):
        history.append({"role": "user", "content": f"Turn {turn}: why does test {turn} fail?"})
        raw = client.messages.with_raw_response.create(
            model="default", system=AGENT_SYSTEM, messages=history, max_tokens=8, extra_body=GREEDY
        )
        message = raw.parse()
        usage = message.usage
        decision = last_decision(router)
        assert decision["predicted_cached_tokens"] == usage.cache_read_input_tokens
        assert decision["cached_tokens"] == usage.cache_read_input_tokens
        backends.append(raw.headers["x-warmfleet-backend"])
        if turn:
            assert raw.headers["x-warmfleet-route-reason"] == "prefix"
            assert usage.cache_read_input_tokens > 0
        text = "".join(b.text for b in message.content if b.type == "text")
        history.append({"role": "assistant", "content": text or "."})
        wait_for_events(router)
    assert len(set(backends)) == 1, backends


def test_anthropic_streams_pass_through_and_count_tokens_is_proxied(router: Daemon) -> None:
    client = anthropic.Anthropic(base_url=router.url, api_key="unused", max_retries=0)
    messages = [{"role": "user", "content": "Summarize the build log."}]
    with client.messages.stream(
        model="default", system=AGENT_SYSTEM, messages=messages, max_tokens=12, extra_body=GREEDY
    ) as stream:
        streamed = stream.get_final_message()
    assert streamed.usage.output_tokens == 12 and streamed.stop_reason == "max_tokens"
    assert streamed.usage.cache_read_input_tokens > 0  # the system prompt, from the earlier test
    decision = last_decision(router)
    assert decision["cached_tokens"] == streamed.usage.cache_read_input_tokens
    again = client.messages.create(
        model="default", system=AGENT_SYSTEM, messages=messages, max_tokens=12, extra_body=GREEDY
    )
    assert [b.model_dump() for b in again.content] == [b.model_dump() for b in streamed.content]
    counted = client.messages.count_tokens(model="default", system=AGENT_SYSTEM, messages=messages)
    usage = streamed.usage
    assert counted.input_tokens == (
        usage.input_tokens + usage.cache_read_input_tokens + usage.cache_creation_input_tokens
    )


def test_agent_session_ids_keep_a_session_on_one_backend(
    router: Daemon, client: openai.OpenAI
) -> None:
    """Claude Code's session header, Anthropic's metadata.user_id (a JSON string holding
    the session id) and the Responses API's prompt_cache_key are session keys."""
    claude = anthropic.Anthropic(base_url=router.url, api_key="unused", max_retries=0)
    user_id = json.dumps({"device_id": "d1", "account_uuid": "", "session_id": "s-42"})
    picks: dict[str, list[tuple[str, str]]] = {"header": [], "user_id": [], "cache_key": []}
    for i in range(3):
        unrelated = f"Unrelated request {i} " * (i + 1)
        raw = claude.messages.with_raw_response.create(
            model="default",
            messages=[{"role": "user", "content": unrelated}],
            max_tokens=4,
            extra_headers={"X-Claude-Code-Session-Id": "cc-session-1"},
        )
        picks["header"].append(_pick(raw.headers))
        raw = claude.messages.with_raw_response.create(
            model="default",
            messages=[{"role": "user", "content": "Other " + unrelated}],
            max_tokens=4,
            metadata={"user_id": user_id},
        )
        picks["user_id"].append(_pick(raw.headers))
        raw = client.responses.with_raw_response.create(
            model="default",
            input="Yet another " + unrelated,
            max_output_tokens=4,
            prompt_cache_key="codex-thread-9",
        )
        picks["cache_key"].append(_pick(raw.headers))
    for source, chosen in picks.items():
        assert len({backend for backend, _ in chosen}) == 1, (source, chosen)
        assert [reason for _, reason in chosen[1:]] == ["session", "session"], (source, chosen)


def test_responses_follow_their_prefix_with_exact_predictions(
    router: Daemon, client: openai.OpenAI
) -> None:
    """The `openai` SDK's Responses API through the router, streamed and not."""
    first = client.responses.create(
        model="default", instructions=AGENT_SYSTEM, input="Plan the fix.", max_output_tokens=8,
        temperature=0,
    )  # fmt: skip
    wait_for_events(router)
    with client.responses.stream(
        model="default", instructions=AGENT_SYSTEM, input="Plan the rollback.",
        max_output_tokens=8, temperature=0,
    ) as stream:  # fmt: skip
        second = stream.get_final_response()
    assert first.usage is not None and second.usage is not None
    cached = second.usage.input_tokens_details.cached_tokens
    assert cached > 0
    decision = last_decision(router)
    assert decision["predicted_cached_tokens"] == decision["cached_tokens"] == cached


def test_router_errors_on_agent_routes_take_their_api_shape(router: Daemon) -> None:
    r = httpx.post(
        f"{router.url}/v1/messages",
        json={"model": "nope", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]},
        timeout=30,
    )  # fmt: skip
    assert r.status_code == 404
    assert r.json() == {"type": "error", "error": {"type": "not_found_error", "message": ANY}}
    r = httpx.post(
        f"{router.url}/v1/responses", json={"model": "no-such-model", "input": "hi"}, timeout=30
    )
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


def _pick(headers: Any) -> tuple[str, str]:
    return headers["x-warmfleet-backend"], headers["x-warmfleet-route-reason"]


def test_bad_input_gets_the_daemons_error_and_changes_nothing(router: Daemon) -> None:
    before = {b["name"]: b["failures"] for b in status(router)["backends"]}
    r = httpx.post(
        f"{router.url}/v1/chat/completions", json={"model": "default", "messages": []}, timeout=30
    )
    assert r.status_code in (400, 422) and "error" in r.json()
    assert r.headers["x-warmfleet-backend"] in before  # answered by a daemon, not retried
    r = httpx.post(f"{router.url}/v1/chat/completions", content=b"{not json", timeout=30)
    assert r.status_code in (400, 422) and "error" in r.json()
    r = httpx.post(f"{router.url}/v1/completions", content=b"x" * (9 << 20), timeout=30)
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    assert {b["name"]: b["failures"] for b in status(router)["backends"]} == before
    assert all(b["health"] == "ready" for b in status(router)["backends"])


def test_metrics_agree_with_the_decisions_and_cover_the_dashboard(
    router: Daemon, client: openai.OpenAI
) -> None:
    # A session's first request with a system prompt: the series the dashboard's
    # first-request panel reads (learned warm prompts).
    seen = len(status(router)["decisions"])
    first = [SYSTEM, {"role": "user", "content": "Who is paged tonight?"}]
    ask(client, first, extra_headers={"x-session-affinity": "first-request-1"})
    for _ in range(50):  # recorded when the response ends, a moment after the client has it
        if len(status(router)["decisions"]) > seen:
            break
        time.sleep(0.05)
    values: dict[str, float] = {}
    exported = set()
    for family in text_string_to_metric_families(httpx.get(f"{router.url}/metrics").text):
        for sample in family.samples:
            exported.add(sample.name)
            if sample.labels.get("gen_ai_request_model") == "tiny-random":
                values[sample.name] = values.get(sample.name, 0) + sample.value
    decisions = [d for d in status(router)["decisions"] if d["cached_tokens"] is not None]
    assert values["warmfleet_router_cached_tokens_total"] == sum(
        d["cached_tokens"] for d in decisions
    )
    assert values["warmfleet_router_predicted_cached_tokens_total"] == sum(
        d["predicted_cached_tokens"] or 0 for d in decisions
    )
    assert values["warmfleet_router_requests_total"] == len(status(router)["decisions"])
    # By tier: the daemons' usage splits every cached token (all RAM here: no disk tier).
    assert values["warmfleet_router_tier_hit_tokens_total"] == sum(
        d["cached_tokens"] for d in decisions
    )
    assert values["warmfleet_router_predicted_tier_hit_tokens_total"] == sum(
        d["predicted_cached_tokens"] or 0 for d in decisions
    )
    assert all(
        d["predicted_by_tier"] == {"ram": d["predicted_cached_tokens"], "disk": 0, "peer": 0}
        for d in decisions
        if d["predicted_cached_tokens"] is not None
    )
    assert values["warmfleet_router_index_resyncs_total"] == 3
    for where, expr in dashboard_queries():
        for name in metric_names(expr):
            if name.startswith("warmfleet_router_"):
                assert name in exported, f"{where} reads {name}, which the router does not export"


def test_failover_before_the_first_byte(
    router: Daemon, daemons: list[Daemon], client: openai.OpenAI
) -> None:
    history = [SYSTEM, {"role": "user", "content": "Who is on call for payments?"}]
    _, backend, _ = ask(client, history, extra_headers={"x-session-affinity": "ops-1"})
    wait_for_events(router)
    victim = next(d for d in daemons if name_of(d) == backend)
    victim.process.kill()  # no drain, no goodbye: the router has not noticed yet
    victim.process.wait()
    history.append({"role": "user", "content": "And for search?"})
    r, second, reason = ask(client, history, extra_headers={"x-session-affinity": "ops-1"})
    assert second != backend and reason == "failover"
    assert r.choices[0].message.content is not None
    dead = next(b for b in status(router)["backends"] if b["name"] == backend)
    assert dead["health"] == "down" and dead["failures"] >= 1
    # Later requests avoid it without trying it first.
    _, third, reason = ask(client, history, extra_headers={"x-session-affinity": "ops-1"})
    assert third == second and reason == "session"


def test_a_stream_cut_after_its_first_byte_ends_with_an_error_event(
    router: Daemon, daemons: list[Daemon], client: openai.OpenAI
) -> None:
    alive = [d for d in daemons if d.process.poll() is None]
    assert len(alive) == 2
    stream = client.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": "Count to a very large number."}],
        temperature=0,
        max_tokens=6000,
        extra_body={"ignore_eos": True},
        stream=True,
    )
    with pytest.raises(openai.APIError, match="mid-stream"):
        for i, _chunk in enumerate(stream):
            if i == 3:
                for d in alive:  # whichever serves it
                    if d.process.poll() is None and _serving(router, d):
                        d.process.kill()


def _serving(router: Daemon, daemon: Daemon) -> bool:
    backends = {b["name"]: b for b in status(router)["backends"]}
    return bool(backends[name_of(daemon)]["in_flight"])


def test_a_session_pushed_to_the_disk_tier_is_predicted_and_served_from_disk(
    tmp_path: Path,
) -> None:
    """A daemon whose RAM holds one long session: the next pushes it to its disk tier;
    the router follows (RAM evictions of blocks the disk holds leave disk blocks), routes
    the session back by time saved, predicts its disk tokens and counts them as served
    from disk (the daemon's usage says so)."""
    daemon = start_daemon(
        "--model", "tiny-random", "--block-size", "32", "--cache-memory-mb", "1",
        "--cache-dir", str(tmp_path / "kv"), "--no-next-turn-prefill",
        env={"WARMFLEET_ADMIN_TOKEN": TOKEN},
    )  # fmt: skip
    router = start_router_for([daemon], tmp_path)
    try:
        client = openai.OpenAI(base_url=f"{router.url}/v1", api_key="unused", max_retries=0)
        costs = status(router)["backends"][0]["tier_costs"]
        assert costs["hit_us_per_token"]["disk"] > 0 and costs["prefill_us_per_token"] > 0

        def session(topic: str) -> list[dict[str, str]]:
            words = " ".join(f"{topic}{i}" for i in range(300))
            return [SYSTEM, {"role": "user", "content": f"Summarize the {topic} log: {words}"}]

        ask(client, session("alpha"))  # ~1,200 tokens: RAM (1 MiB) holds ~1,300
        ask(client, session("beta"))
        wait_for_events(router, 1.0)
        r, _, reason = ask(client, session("alpha"))
        decision = last_decision(router)
        served = r.usage.model_extra["cached_tokens_by_tier"]
        assert reason == "prefix" and served["disk"] > 0
        assert decision["predicted_by_tier"]["disk"] > 0
        assert decision["predicted_cached_tokens"] == served["ram"] + served["disk"]
        text = httpx.get(f"{router.url}/metrics").text
        tiers = {
            (s.name, s.labels["warmfleet_cache_tier"]): s.value
            for f in text_string_to_metric_families(text)
            for s in f.samples
            if "warmfleet_cache_tier" in s.labels
        }
        assert tiers[("warmfleet_router_tier_hit_tokens_total", "disk")] == served["disk"]
        assert tiers[("warmfleet_router_predicted_tier_hit_tokens_total", "disk")] > 0
    finally:
        router.stop()
        daemon.stop()
