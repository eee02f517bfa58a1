"""The cache-event routes of a real daemon (tiny model, admin token): the stream follows
a snapshot without a gap, its keys are the ones a router computes from the daemon's
served layout, a clear is an event, a stale or foreign position gets a reset, and the
heartbeats say what a router would otherwise poll for."""

from __future__ import annotations

import http.client
import json
import signal
import time
from collections.abc import Generator, Iterator

import httpx
import pytest

from support.processes import Daemon, start_daemon
from warmfleet_common.cache_layout import CacheLayout
from warmfleet_common.wire import CacheSnapshot, parse_event_line
from warmfleet_router.keys import LayoutKeyer
from warmfleet_router.routes import request_blocks

TOKEN = "events-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
CHAT = {
    "model": "default",
    "temperature": 0,
    "max_tokens": 4,
    "messages": [
        {"role": "system", "content": "You are Scout, the SRE team's log analyst. " * 8},
        {"role": "user", "content": "Which pod restarted most often today?"},
    ],
}


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    d = start_daemon(
        "--model", "tiny-random", "--block-size", "32", env={"WARMFLEET_ADMIN_TOKEN": TOKEN}
    )
    yield d
    d.stop()


def lines(daemon: Daemon, **params: object) -> Generator[dict[str, object], None, None]:
    with httpx.stream(
        "GET",
        f"{daemon.url}/v1/cache/events",
        params={"heartbeat": 0.5, **params},
        headers=AUTH,
        timeout=30,
    ) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("application/x-ndjson")
        for line in r.iter_lines():
            if line:
                parse_event_line(line)  # every line is a wire model's
                yield json.loads(line)


def test_the_admin_routes_need_the_token(daemon: Daemon) -> None:
    for path in ("/v1/cache/snapshot", "/v1/cache/events", "/v1/cache/layout"):
        r = httpx.get(f"{daemon.url}{path}", timeout=10)
        assert r.status_code == 401, path
        assert r.json()["error"]["code"] == "missing_token"


def test_events_after_a_snapshot_carry_the_keys_a_router_computes(daemon: Daemon) -> None:
    snap = httpx.get(f"{daemon.url}/v1/cache/snapshot", headers=AUTH, timeout=30).json()
    CacheSnapshot.model_validate(snap)
    layout = CacheLayout.model_validate(
        httpx.get(f"{daemon.url}/v1/cache/layout", headers=AUTH, timeout=30).json()
    )
    assert snap["fingerprint"] == layout.fingerprint and layout.block_size == 32
    assert layout.costs is not None and "disk" not in layout.costs.hit_us_per_token
    assert 0 < layout.costs.hit_us_per_token["ram"] < layout.costs.prefill_us_per_token
    light = httpx.get(
        f"{daemon.url}/v1/cache/layout?tokenizer_files=false", headers=AUTH, timeout=30
    ).json()  # what a router that holds this fingerprint's files reads
    assert light["tokenizer_files"] == {} and layout.tokenizer_files
    assert light == {**layout.model_dump(mode="json"), "tokenizer_files": {}}
    expected = request_blocks(LayoutKeyer(layout), "chat", CHAT)
    assert len(expected.keys) >= 3  # system prompt blocks, then the question

    r = httpx.post(f"{daemon.url}/v1/chat/completions", json=CHAT, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == expected.tokens

    stream = lines(daemon, after=snap["seq"], epoch=snap["epoch"])
    hello = next(stream)
    assert hello["type"] == "hello" and hello["epoch"] == snap["epoch"]
    stored: list[str] = []
    seq = snap["seq"]
    for event in stream:
        if event["type"] == "heartbeat":
            assert event["seq"] == seq  # nothing skipped
            break
        assert event["seq"] == seq + 1
        seq = event["seq"]
        if event["type"] == "stored":
            stored.append(str(event["key"]))
            assert event["source"] == "prefill"  # computed here
    # The request's blocks, in order; then those of its next turn (the answer), if the
    # idle-priority prefill ran before the heartbeat.
    assert [k.hex() for k in expected.keys] == stored[: len(expected.keys)]

    # The snapshot now holds the same blocks, current at the same number.
    again = httpx.get(f"{daemon.url}/v1/cache/snapshot", headers=AUTH, timeout=30).json()
    assert again["seq"] == seq
    assert {b["key"] for b in again["blocks"]} >= set(stored)


def test_a_clear_is_an_event(daemon: Daemon) -> None:
    seq = httpx.get(f"{daemon.url}/v1/cache/snapshot", headers=AUTH, timeout=30).json()["seq"]
    assert (
        httpx.delete(f"{daemon.url}/v1/cache/prefix", headers=AUTH, timeout=30).status_code == 200
    )
    stream = lines(daemon, after=seq)
    assert next(stream)["type"] == "hello"
    assert next(stream) == {"seq": seq + 1, "type": "cleared"}


def test_a_foreign_epoch_or_a_future_position_gets_a_reset(daemon: Daemon) -> None:
    stream = lines(daemon, after=0, epoch="0" * 32)
    assert next(stream)["type"] == "hello"
    assert next(stream) == {"type": "reset", "reason": "epoch"}
    assert list(stream) == []  # and the stream ends
    stream = lines(daemon, after=10**9)
    assert next(stream)["type"] == "hello"
    assert next(stream) == {"type": "reset", "reason": "gap"}


def test_heartbeats_say_the_state_and_a_digest_of_the_warm_sets(daemon: Daemon) -> None:
    """What a router would otherwise poll for: serving or draining, and a digest that
    changes when the warm sets do (a busy stream beats too)."""
    stream = lines(daemon, heartbeat=0.2)
    beats = (line for line in stream if line["type"] == "heartbeat")
    first = next(beats)
    assert first["state"] == "serving" and isinstance(first["warm_sets"], str)
    assert next(beats)["warm_sets"] == first["warm_sets"]  # nothing changed
    body = {"generation": 1, "prompts": [{"name": "scout", "messages": CHAT["messages"][:1]}]}
    put = httpx.put(f"{daemon.url}/v1/warm-sets/sre/scout", json=body, headers=AUTH)
    assert put.status_code == 202
    try:
        changed = next(b for b in beats if b["warm_sets"] != first["warm_sets"])
        assert changed["state"] == "serving"
    finally:
        httpx.delete(f"{daemon.url}/v1/warm-sets/sre/scout", headers=AUTH)
        stream.close()


def test_a_stopping_daemon_ends_its_feeds_at_once() -> None:
    """The router's feed never ends by itself: a SIGTERM says at once that the daemon
    drains, and (after its drain) ends the feed, so the server stops without waiting out
    its graceful shutdown and cancelling the feed."""
    own = start_daemon(
        "--model", "tiny-random", "--drain-seconds", "1", env={"WARMFLEET_ADMIN_TOKEN": TOKEN}
    )
    try:
        stream = lines(own, heartbeat=30)
        assert next(stream)["type"] == "hello"
        started = time.monotonic()
        own.process.send_signal(signal.SIGTERM)
        # It says at once that it drains (a router hears it without polling), then the
        # feed ends: no reset, no error.
        said = list(stream)
        assert [(line["type"], line["state"]) for line in said] == [("heartbeat", "draining")]
        assert own.process.wait(timeout=30) in (0, -signal.SIGTERM)  # uvicorn re-raises it
        assert time.monotonic() - started < 30
    finally:
        own.stop()
    assert "Traceback" not in own.log() and "graceful shutdown exceeded" not in own.log()


def test_an_idle_keep_alive_connection_outlives_the_clients_idle_expiry(daemon: Daemon) -> None:
    """A client reusing a connection the server is closing gets a reset it cannot retry
    (a POST): the server keeps idle connections longer than agents' clients do (httpx,
    the OpenAI SDK: 5 s)."""
    host, port = daemon.url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        connection.request("GET", "/healthz")
        assert connection.getresponse().read() is not None
        time.sleep(6)  # past httpx's 5 s, and uvicorn's default keep-alive
        connection.request("GET", "/healthz")  # on the same socket: http.client never redials
        assert connection.getresponse().status == 200
    finally:
        connection.close()
