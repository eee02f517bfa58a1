"""The disk tier end to end, as the router sees it, with nothing faked: a tiny-random
daemon with `--state-dir` (its disk tier under it) and a RAM of about one session, a
plain daemon beside it, a real router in front of both. A session that leaves RAM for
the disk is on `/v1/cache/events` as blocks stored in the disk tier (the event log's own
`tier_listener`) and on `/v1/cache/snapshot` as blocks whose `tiers` name the disk; the
router's index predicts disk tokens for the session's next request, routes it to the
daemon whose disk holds them, and the daemon reads them from there
(`cached_tokens_by_tier` on the wire, as `TierTokens`)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from support.processes import Daemon, start_daemon
from support.router import AUTH, TOKEN, start_router_for, status, wait_following

SYSTEM = "You are Relay, the incident commander's assistant. Keep answers short. " * 6


def session(topic: str) -> list[dict[str, str]]:
    """~1,200 tokens: the disk daemon's RAM (1 MiB) holds one of them."""
    words = " ".join(f"{topic}{i}" for i in range(300))
    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"Summarize the {topic} log: {words}"},
    ]


class Fleet:
    def __init__(self, disk: Daemon, plain: Daemon, router: Daemon, state_dir: Path) -> None:
        self.disk, self.plain, self.router, self.state_dir = disk, plain, router, state_dir


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    state_dir = tmp_path_factory.mktemp("state")
    common = ("--model", "tiny-random", "--block-size", "32", "--no-next-turn-prefill")
    env = {"WARMFLEET_ADMIN_TOKEN": TOKEN}
    with ExitStack() as stack:
        disk = start_daemon(
            *common, "--cache-memory-mb", "1", "--state-dir", str(state_dir), env=env
        )
        stack.callback(disk.stop)
        plain = start_daemon(*common, env=env)
        stack.callback(plain.stop)
        router = start_router_for([disk, plain], tmp_path_factory.mktemp("router"))
        stack.callback(router.stop)
        wait_following(router, 2)
        yield Fleet(disk, plain, router, state_dir)


def chat(url: str, messages: list[dict[str, str]]) -> httpx.Response:
    r = httpx.post(
        f"{url}/v1/chat/completions",
        json={"model": "default", "messages": messages, "temperature": 0, "max_tokens": 4},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    return r


def events(daemon: Daemon) -> list[dict[str, Any]]:
    """Every event `/v1/cache/events` has kept since the start (its backlog): read up to
    the first heartbeat, which comes once the backlog is sent."""
    lines: list[dict[str, Any]] = []
    params = {"after": 0, "heartbeat": 0.2}
    url = f"{daemon.url}/v1/cache/events"
    with httpx.stream("GET", url, params=params, headers=AUTH, timeout=30) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            event = json.loads(line)
            if event["type"] == "heartbeat":
                break
            lines.append(event)
    return lines


def test_a_session_evicted_to_disk_is_on_the_events_predicted_routed_and_read_from_disk(
    fleet: Fleet,
) -> None:
    # The session lands on the disk daemon, then another pushes it out of its RAM.
    chat(fleet.disk.url, session("alpha"))
    chat(fleet.disk.url, session("beta"))
    assert (fleet.state_dir / "kv-cache").is_dir()  # the disk tier is under --state-dir

    # The events say so: blocks stored in the disk tier, blocks evicted from RAM, none
    # evicted from the disk.
    seen = events(fleet.disk)
    changes = {(e["type"], e.get("tier")) for e in seen if e["type"] in ("stored", "evicted")}
    assert {("stored", "ram"), ("stored", "disk"), ("evicted", "ram")} <= changes
    assert ("evicted", "disk") not in changes
    on_disk = {e["key"] for e in seen if (e["type"], e.get("tier")) == ("stored", "disk")}
    evicted = {e["key"] for e in seen if (e["type"], e.get("tier")) == ("evicted", "ram")}
    assert evicted & on_disk  # blocks that left RAM are still the disk's

    # The snapshot too: blocks only the disk holds now, named by their `tiers`.
    snapshot = httpx.get(f"{fleet.disk.url}/v1/cache/snapshot", headers=AUTH, timeout=30)
    blocks = snapshot.json()["blocks"]
    only_disk = [b for b in blocks if b["tiers"] == ["disk"]]
    assert only_disk and all(b["tier"] == "disk" and b["on_disk"] for b in only_disk)
    assert {b["key"] for b in only_disk} <= on_disk

    # The router predicts the session's disk tokens, routes it to the daemon whose disk
    # holds them, and the daemon reads them from there.
    client = openai.OpenAI(base_url=f"{fleet.router.url}/v1", api_key="unused", max_retries=0)
    deadline = time.monotonic() + 30
    while True:  # the events reach the router within milliseconds
        sent = time.time()
        raw = client.chat.completions.with_raw_response.create(
            model="default",
            messages=session("alpha"),  # type: ignore[arg-type]
            temperature=0,
            max_tokens=4,
        )
        decision = _decision_since(fleet.router, sent)
        if decision["predicted_by_tier"] and decision["predicted_by_tier"]["disk"] > 0:
            break
        assert time.monotonic() < deadline, f"no disk tokens predicted: {decision}"
        chat(fleet.disk.url, session("beta"))  # alpha back out of RAM, then again
    r = raw.parse()
    assert raw.headers["x-warmfleet-backend"] == fleet.disk.url.removeprefix("http://")
    assert raw.headers["x-warmfleet-route-reason"] == "prefix"
    assert r.usage is not None and r.usage.model_extra is not None
    served = r.usage.model_extra["cached_tokens_by_tier"]
    assert set(served) == {"ram", "disk", "peer"} and served["disk"] > 0
    assert r.usage.prompt_tokens_details is not None
    assert sum(served.values()) == r.usage.prompt_tokens_details.cached_tokens
    assert decision["predicted_by_tier"]["disk"] == served["disk"]
    assert decision["predicted_cached_tokens"] == served["ram"] + served["disk"]
    assert decision["cached_tokens"] == sum(served.values())


def _decision_since(router: Daemon, sent: float) -> dict[str, Any]:
    """The router's routing decision for the request sent at `sent` (recorded when the
    response ends, a moment after the client has it)."""
    for _ in range(100):
        decisions = [d for d in status(router)["decisions"] if d["time"] >= sent]
        if decisions:
            return dict(decisions[0])
        time.sleep(0.05)
    raise AssertionError("no decision recorded")
