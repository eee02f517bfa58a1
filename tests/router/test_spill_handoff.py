"""The fleet as one cache, with a real router in front of two real tiny-random daemons:
a daemon honours a spill peer only when the router signed it (a client's header is
refused, and the router drops it); when one daemon drains (SIGTERM), the router hands
its most recent session to the other (`POST /v1/cache/pull`), and a session it did not
hand off is spilled: the other daemon copies its blocks from the draining one (tier
`peer` in its metrics) instead of prefilling them; the draining daemon stops on time. A
backend whose WarmNode is deleted hands its sessions off the same way, then is gone.

Nodes with their own admin tokens (WarmNodes naming different Secrets) do all of it with
peer grants: whoever names the peer (the pusher, the router) signs a short-lived grant
with the peer's token, and the peer honours it on its read-only routes only; an expired,
forged or misdirected grant is a 401 and the receiver prefills instead."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from support.processes import Daemon, serving
from support.router import (
    AUTH,
    TOKEN,
    start_router_for,
    status,
    tiny_daemons,
    wait_following,
    wait_for,
)
from warmfleet_common.grants import GRANT_HEADER, MAX_GRANT_S, issue_grant
from warmfleet_common.spill import PEER_HEADER, PEER_SIGNATURE_HEADER, peer_signature
from warmfleet_router.app import create_app
from warmfleet_router.backend import BackendSpec
from warmfleet_router.options import RouterOptions
from warmfleet_router.sync import SyncOptions

DRAIN_S = 8
SPILL = ("--spill", "always", "--drain-seconds", str(DRAIN_S))


def history(topic: str) -> list[dict[str, str]]:
    system = {"role": "system", "content": f"You are the {topic} desk. Answer briefly. " * 12}
    return [system, {"role": "user", "content": f"Tell me about {topic}. " * 20}]


@pytest.fixture(scope="module")
def daemons() -> Iterator[list[Daemon]]:
    with tiny_daemons(*SPILL, tokens=[TOKEN] * 2) as started:
        yield started


@pytest.fixture(scope="module")
def router(daemons: list[Daemon], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    r = start_router_for(
        daemons, tmp_path_factory.mktemp("router"), "--health-interval", "0.3",
        "--handoff-sessions", "1",
    )  # fmt: skip
    wait_following(r, 2)
    yield r
    r.stop()


def chat(url: str, messages: list[dict[str, str]], **headers: str) -> httpx.Response:
    body = {"model": "default", "messages": messages, "temperature": 0, "max_tokens": 4}
    return httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=60)


def a_session_on(router_url: str, holder: str, prefix: str) -> str:
    """A new session key (PREFIX-1, PREFIX-2, ...) whose first turn the router sends to
    `holder` (new sessions spread by a hash of their key)."""
    return next(
        key
        for key in (f"{prefix}-{i}" for i in range(1, 40))
        if chat(router_url, history(key), **{"x-session-affinity": key}).headers[
            "x-warmfleet-backend"
        ]
        == holder
    )


def peer_hits(daemon: Daemon) -> float:
    text = httpx.get(f"{daemon.url}/metrics", timeout=10).text
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "warmfleet_prefix_cache_tier_hit_tokens_total"
        and s.labels.get("warmfleet_cache_tier") == "peer"
    )


def test_a_daemon_honours_only_a_peer_the_router_signed(daemons: list[Daemon]) -> None:
    a, b = daemons
    messages = history("weather")
    for url in ("http://169.254.169.254", b.url):
        refused = chat(a.url, messages, **{PEER_HEADER: url})
        assert refused.status_code == 403, refused.text
        assert refused.json()["error"]["param"] == PEER_HEADER
    forged = chat(a.url, messages, **{PEER_HEADER: b.url, PEER_SIGNATURE_HEADER: "0" * 64})
    assert forged.status_code == 403
    bad = chat(a.url, messages, **{PEER_HEADER: "file:///etc/passwd"})
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_peer"
    signed = {PEER_HEADER: b.url, PEER_SIGNATURE_HEADER: peer_signature(TOKEN, b.url)}
    assert chat(a.url, messages, **signed).status_code == 200


def test_a_pull_is_admin_and_refuses_a_broken_chain(daemons: list[Daemon]) -> None:
    a, b = daemons
    chain = [{"key": "ab" * 16, "start": 0, "end": 32}, {"key": "cd" * 16, "start": 32, "end": 64}]
    body = {"peer": b.url, "blocks": chain, "deadline_s": 5}
    url = f"{a.url}/v1/cache/pull"
    assert httpx.post(url, json=body).status_code == 401
    for bad, param in [
        ({**body, "blocks": chain[1:]}, "blocks"),  # not from 0
        ({**body, "peer": "file:///etc/passwd"}, "peer"),
        ({**body, "deadline_s": 0}, "deadline_s"),
        ({**body, "extra": 1}, "extra"),
    ]:
        refused = httpx.post(url, json=bad, headers=AUTH)
        assert refused.status_code == 400, refused.text
        assert param in refused.text
    # Blocks the peer does not hold: nothing copied, and it says so.
    result = httpx.post(url, json=body, headers=AUTH, timeout=30).json()
    assert result["copied_blocks"] == 0 and result["complete"] is False


class Nodes:
    """A backend source the test changes (a WarmNode deleted), read every 0.1 s."""

    def __init__(self, specs: list[BackendSpec]) -> None:
        self.current = specs

    async def specs(self) -> list[BackendSpec]:
        return list(self.current)

    async def changes(self) -> AsyncIterator[list[BackendSpec]]:
        last: list[BackendSpec] | None = None
        while True:
            if self.current != last:
                last = list(self.current)
                yield last
            await asyncio.sleep(0.1)

    async def close(self) -> None:
        return None


def test_a_deleted_backends_sessions_move_with_their_blocks(daemons: list[Daemon]) -> None:
    specs = [BackendSpec(d.url.removeprefix("http://"), d.url, TOKEN) for d in daemons]
    nodes = Nodes(specs)
    options = RouterOptions(
        admin_token=TOKEN, handoff_sessions=4, sync=SyncOptions(health_interval=0.3)
    )
    with serving(create_app(nodes, options)) as url:
        r = Daemon(url, None, "")  # type: ignore[arg-type]
        wait_following(r, 2)
        first = chat(url, history("trains"), **{"x-session-affinity": "d-0"})
        holder = first.headers["x-warmfleet-backend"]
        nodes.current = [s for s in specs if s.name != holder]  # its WarmNode is deleted
        wait_for(lambda: len(status(r)["backends"]) == 1, 15)  # after the handoff
        (handoff,) = status(r)["handoffs"]
        (moved,) = handoff["sessions"]
        assert handoff["backend"] == holder and moved["outcome"] == "copied", handoff
        turn = chat(url, history("trains"), **{"x-session-affinity": "d-0"})
        assert turn.headers["x-warmfleet-backend"] == nodes.current[0].name
        cached = turn.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert cached >= moved["copied_tokens"] > 0


def test_a_draining_daemons_sessions_are_handed_off_or_spilled(
    daemons: list[Daemon], router: Daemon
) -> None:
    # Two sessions on the same daemon (new sessions spread by a hash of their key).
    first = chat(router.url, history("ships"), **{"x-session-affinity": "s-0"})
    assert first.status_code == 200
    holder = first.headers["x-warmfleet-backend"]
    second_key = a_session_on(router.url, holder, "s")
    draining = next(d for d in daemons if d.url.removeprefix("http://") == holder)
    other = next(d for d in daemons if d is not draining)
    # A client cannot name a peer through the router: the header is dropped.
    through = chat(router.url, history("ships"), **{PEER_HEADER: "http://169.254.169.254"})
    assert through.status_code == 200

    draining.process.send_signal(signal.SIGTERM)
    stopped_at = time.monotonic()
    wait_for(lambda: httpx.get(f"{draining.url}/readyz").json()["status"] == "draining", 5)
    assert httpx.get(f"{draining.url}/v1/status").json()["state"] == "draining"
    # The most recent session is handed off: the other daemon pulls its blocks.
    wait_for(lambda: status(router)["handoffs"], 15)
    handoff = status(router)["handoffs"][0]
    assert handoff["backend"] == holder and len(handoff["sessions"]) == 1
    moved = handoff["sessions"][0]
    assert moved["outcome"] == "copied" and moved["copied_tokens"] > 0, handoff
    turn = chat(router.url, history(second_key), **{"x-session-affinity": second_key})
    assert turn.headers["x-warmfleet-backend"] == other.url.removeprefix("http://")
    usage = turn.json()["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] >= moved["copied_tokens"] - 32

    # The first session was not handed off: it is spilled, copied from the draining daemon.
    before = peer_hits(other)
    spilled = chat(router.url, history("ships"), **{"x-session-affinity": "s-0"})
    assert spilled.headers["x-warmfleet-backend"] == other.url.removeprefix("http://")
    cached = spilled.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    copied = peer_hits(other) - before
    assert 0 < copied <= cached and cached - copied < 32  # (a shared template start was held)
    decision = next(d for d in status(router)["decisions"] if d["peer"] is not None)
    assert decision["peer"] == holder

    draining.process.wait(timeout=DRAIN_S + 30)
    assert time.monotonic() - stopped_at >= DRAIN_S - 1  # it served until the drain's end


# -- nodes with their own admin tokens: peer grants ---------------------------------------

OWN_TOKENS = ("token-of-node-a", "token-of-node-b")


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture(scope="module")
def own() -> Iterator[list[Daemon]]:
    """Two daemons, each with an admin token of its own."""
    with tiny_daemons(*SPILL, tokens=OWN_TOKENS) as started:
        yield started


def warm(daemon: Daemon, token: str, name: str, system: str, peers: list[Any]) -> dict[str, Any]:
    """Push one prompt as set ops/NAME naming `peers`; its state once warm."""
    prompt = {"name": name, "messages": [{"role": "system", "content": system}]}
    url = f"{daemon.url}/v1/warm-sets/ops/{name}"
    r = httpx.put(url, json={"prompts": [prompt], "peers": peers}, headers=auth(token))
    assert r.status_code == 202, r.text

    def done() -> bool:
        state = httpx.get(url, headers=auth(token)).json()["prompts"][0]["state"]
        return bool(state in ("warm", "failed"))

    wait_for(done, 60)
    (state,) = httpx.get(url, headers=auth(token)).json()["prompts"]
    assert state["state"] == "warm", state
    return dict(state)


def restored(daemon: Daemon, token: str) -> int:
    status = httpx.get(f"{daemon.url}/v1/status", headers=auth(token)).json()
    return int(status["kv_transfer"]["restored_tokens"])


def test_a_peer_honours_a_grant_on_its_read_only_routes_only(own: list[Daemon]) -> None:
    a, b = own
    token_a, token_b = OWN_TOKENS
    fingerprint = f"{a.url}/v1/cache/fingerprint"
    good = issue_grant(token_a, a.url)
    answer = httpx.get(fingerprint, headers={GRANT_HEADER: good})
    assert answer.status_code == 200 and answer.json()["fingerprint"]
    blocks = httpx.get(f"{a.url}/v1/cache/blocks", params={"keys": "ab" * 16},
                       headers={GRANT_HEADER: good})  # fmt: skip
    assert blocks.status_code == 200 and blocks.content == b""  # not held: no frame
    now = time.time()
    for bad, why in [
        (issue_grant(token_a, a.url, now=now - MAX_GRANT_S), "expired"),
        (issue_grant(token_b, a.url), "not signed for this daemon"),  # forged: another key
        (issue_grant(token_a, b.url), "not signed for this daemon"),  # another node's URL
        (issue_grant(token_a, a.url, now=now + 3600), "ahead"),
        ("12.nope", "malformed"),
    ]:
        refused = httpx.get(fingerprint, headers={GRANT_HEADER: bad})
        assert refused.status_code == 401, refused.text
        error = refused.json()["error"]
        assert error["code"] == "invalid_grant" and why in error["message"]
        assert error["param"] == GRANT_HEADER
    # Read-only: the admin routes do not take it.
    admin = [("POST", "/v1/cache/pull"), ("GET", "/v1/warm-sets"), ("DELETE", "/v1/cache/prefix")]
    for method, path in [*admin, ("GET", "/v1/cache/snapshot")]:
        r = httpx.request(method, f"{a.url}{path}", headers={GRANT_HEADER: good}, json={})
        assert r.status_code == 401, (path, r.text)
        assert r.json()["error"]["code"] == "missing_token"


def test_a_push_with_a_grant_copies_from_a_peer_with_its_own_token(own: list[Daemon]) -> None:
    a, b = own
    token_a, token_b = OWN_TOKENS
    systems = [f"You are the {desk} desk of the harbour office. Be brief. " * 12
               for desk in ("tides", "cargo", "pilots")]  # fmt: skip
    # The reference: the answer of a daemon that computes everything.
    messages = [{"role": "system", "content": systems[0]}, {"role": "user", "content": "Hi?"}]
    reference = chat(b.url, messages, **auth(token_b)).json()
    assert reference["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    httpx.delete(f"{b.url}/v1/cache/prefix", headers=auth(token_b)).raise_for_status()
    tokens = [warm(a, token_a, f"desk-{i}", s, [])["tokens"] for i, s in enumerate(systems)]

    before = restored(b, token_b)
    grant = issue_grant(token_a, a.url)
    copied = warm(b, token_b, "desk-0", systems[0], [{"url": a.url, "grant": grant}])
    assert copied["computed_tokens"] == 0 and copied["tokens"] == tokens[0]
    assert restored(b, token_b) - before == tokens[0]
    answer = chat(b.url, messages, **auth(token_b)).json()
    assert answer["choices"] == reference["choices"]
    assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] == tokens[0]

    # Without a grant b asks with its own token (refused), with an expired one the grant
    # is refused (401): both prefill, and the log says why.
    expired = issue_grant(token_a, a.url, now=time.time() - MAX_GRANT_S)
    for i, peer in [(1, a.url), (2, {"url": a.url, "grant": expired})]:
        prefilled = warm(b, token_b, f"desk-{i}", systems[i], [peer])
        # (a shared template start may be held already)
        assert prefilled["computed_tokens"] > tokens[i] - 32, prefilled
    assert restored(b, token_b) - before == tokens[0]  # nothing copied
    log = b.log()
    assert f"peer {a.url}: GET /v1/cache/fingerprint answered 403" in log
    assert "answered 401 to the grant" in log and "expired" in log


def test_a_spill_the_client_attaches_a_grant_to_is_refused(own: list[Daemon]) -> None:
    a, b = own
    token_a, token_b = OWN_TOKENS
    messages = history("lighthouses")
    grant = issue_grant(token_a, a.url)
    # Signed for the URL alone: a grant added to it is not the router's.
    unsigned = {PEER_HEADER: a.url, PEER_SIGNATURE_HEADER: peer_signature(token_b, a.url)}
    refused = chat(b.url, messages, **unsigned, **{GRANT_HEADER: grant})
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "peer_not_allowed"
    malformed = chat(b.url, messages, **unsigned, **{GRANT_HEADER: "soon.abc"})
    assert malformed.status_code == 400 and malformed.json()["error"]["param"] == GRANT_HEADER

    # Signed over a forged grant: b honours the router, a refuses the grant, b prefills.
    reference = chat(a.url, messages, **auth(token_a)).json()  # a holds the blocks now
    before = peer_hits(b)
    forged = issue_grant(token_b, a.url)
    signed = {PEER_HEADER: a.url, GRANT_HEADER: forged,
              PEER_SIGNATURE_HEADER: peer_signature(token_b, a.url, forged)}  # fmt: skip
    prefilled = chat(b.url, messages, **signed)
    assert prefilled.status_code == 200, prefilled.text
    assert prefilled.json()["choices"] == reference["choices"]
    assert prefilled.json()["usage"]["prompt_tokens_details"]["cached_tokens"] < 32  # prefilled
    assert peer_hits(b) == before
    assert "answered 401 to the grant" in b.log() and "not signed for this daemon" in b.log()


def test_nodes_with_their_own_tokens_hand_off_and_spill_with_grants(own: list[Daemon]) -> None:
    """As the drain test above, through a router that holds each node's own token (as
    `--from-cluster` does with WarmNodes naming different Secrets). Runs last: it stops
    one of the daemons."""
    specs = [
        BackendSpec(d.url.removeprefix("http://"), d.url, token)
        for d, token in zip(own, OWN_TOKENS)
    ]
    options = RouterOptions(handoff_sessions=1, sync=SyncOptions(health_interval=0.3))
    logged = {d.url: len(d.log()) for d in own}  # what the tests before this one logged
    with serving(create_app(Nodes(specs), options)) as url:
        r = Daemon(url, None, "")  # type: ignore[arg-type]
        wait_following(r, 2)
        first = chat(url, history("canals"), **{"x-session-affinity": "g-0"})
        assert first.json()["usage"]["prompt_tokens_details"]["cached_tokens"] < 32  # computed
        holder = first.headers["x-warmfleet-backend"]
        second_key = a_session_on(url, holder, "g")
        draining = next(d for d in own if d.url.removeprefix("http://") == holder)
        other = next(d for d in own if d is not draining)

        draining.process.send_signal(signal.SIGTERM)
        # The handoff: the other node pulls the most recent session with a grant.
        wait_for(lambda: status(r)["handoffs"], 15)
        (moved,) = status(r)["handoffs"][0]["sessions"]
        assert moved["outcome"] == "copied" and moved["copied_tokens"] > 0, moved
        turn = chat(url, history(second_key), **{"x-session-affinity": second_key})
        assert turn.headers["x-warmfleet-backend"] == other.url.removeprefix("http://")
        cached = turn.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert cached >= moved["copied_tokens"] - 32

        # The spill: the session not handed off is copied from the draining node.
        before = peer_hits(other)
        spilled = chat(url, history("canals"), **{"x-session-affinity": "g-0"})
        assert spilled.headers["x-warmfleet-backend"] == other.url.removeprefix("http://")
        cached = spilled.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
        copied = peer_hits(other) - before
        assert 0 < copied <= cached and cached - copied < 32
        assert spilled.json()["choices"] == first.json()["choices"]  # as computed from scratch
        new_log = other.log()[logged[other.url] :]
        assert "401" not in new_log and "403" not in new_log, new_log
        # Its snapshot tells the copied blocks from those it computed.
        token = OWN_TOKENS[own.index(other)]
        snap = httpx.get(f"{other.url}/v1/cache/snapshot", headers=auth(token)).json()
        assert {b["source"] for b in snap["blocks"]} == {"peer", "prefill"}
    draining.process.wait(timeout=DRAIN_S + 30)
