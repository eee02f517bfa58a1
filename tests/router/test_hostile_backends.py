"""A lying or broken backend cannot grow the router, hang it or stop its background
tasks: every payload of issue #23 against fake backends (httpx.MockTransport), each with
small limits. A bad payload is logged once, counted, kept as the reason in the status,
and the task goes on; reads stop at their byte limit or deadline; requests the daemons
would refuse (deep JSON, token ids, a prompt over every context) are the daemons' 400s
without reaching a backend."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
import pytest_asyncio

from support.layouts import tiny_layout
from support.router import mocked_fleet
from warmfleet_common import bounded
from warmfleet_router import sync
from warmfleet_router.backend import Backend, BackendSpec
from warmfleet_router.fleet import Fleet
from warmfleet_router.index import ENTRY_BYTES, BlockIndex
from warmfleet_router.options import ProxyOptions, RouterOptions
from warmfleet_router.policy.model import Decision
from warmfleet_router.proxy import forward
from warmfleet_router.routes import CHAT, COMPLETION
from warmfleet_router.sessions import MAX_KEY_CHARS, SessionTable, capped
from warmfleet_router.status import status_detail
from warmfleet_router.sync import ReadLimits, SyncOptions

pytestmark = pytest.mark.asyncio
KEY = "0f" * 16
HELLO = {"type": "hello", "epoch": "e1", "seq": 0}


async def endless(piece: bytes = b"x" * 65536, pause: float = 0.0) -> AsyncIterator[bytes]:
    while True:
        yield piece
        await asyncio.sleep(pause)


def lines(*docs: Any, then: AsyncIterator[bytes] | None = None) -> AsyncIterator[bytes]:
    async def gen() -> AsyncIterator[bytes]:
        for doc in docs:
            yield (doc if isinstance(doc, bytes) else json.dumps(doc).encode()) + b"\n"
        if then is not None:
            async for piece in then:
                yield piece
        else:
            await asyncio.Event().wait()  # a quiet stream (heartbeats come from `then`)

    return gen()


Handler = Callable[[httpx.Request], Any]


class Fake:
    """A warmfleet daemon whose answers the test replaces route by route."""

    def __init__(self) -> None:
        self.asked: dict[str, int] = {}
        self.routes: dict[str, Handler] = {
            "/readyz": lambda r: httpx.Response(200, json={"status": "ready"}),
            "/v1/models": lambda r: httpx.Response(200, json={"data": [{"id": "m"}]}),
            "/v1/status": lambda r: httpx.Response(200, json={"model": {"aliases": ["m"]}}),
            "/v1/warm-sets": lambda r: httpx.Response(200, json={"sets": []}),
            "/v1/cache/snapshot": lambda r: httpx.Response(
                200, json={"epoch": "e1", "seq": 0, "fingerprint": None, "blocks": []}
            ),
            "/v1/cache/events": lambda r: httpx.Response(200, content=lines(HELLO)),
            "/v1/chat/completions": lambda r: httpx.Response(
                200, json={"choices": [], "usage": {"prompt_tokens": 3}}
            ),
            "/v1/completions": lambda r: httpx.Response(200, json={"choices": []}),
        }

    def __call__(self, request: httpx.Request) -> Any:
        path = request.url.path
        self.asked[path] = self.asked.get(path, 0) + 1
        if path not in self.routes:
            return httpx.Response(404, json={"error": {"message": "no such route"}})
        return self.routes[path](request)


SYNC = SyncOptions(
    health_interval=0.05,
    models_interval=0.05,
    warm_sets_interval=0.05,
    heartbeat=0.1,
    retry=0.02,
    max_retry=0.1,
    limits=ReadLimits(
        small=16 << 10, warm_sets=16 << 10, layout=4 << 20, snapshot=64 << 10,
        event_line=4 << 10, deadline=1.0, large_deadline=1.0,
    ),
)  # fmt: skip
PROXY = ProxyOptions(
    request_timeout=1.0,
    max_response_bytes=256 << 10,
    buffer_bytes=16 << 10,
    max_error_bytes=1 << 10,
)


@pytest_asyncio.fixture
async def fake() -> Fake:
    return Fake()


@pytest_asyncio.fixture
async def fleet(fake: Fake) -> AsyncIterator[Fleet]:
    async with mocked_fleet(RouterOptions(sync=SYNC, proxy=PROXY), fake) as fleet:
        yield fleet


async def start(fleet: Fleet) -> Backend:
    await fleet.members.apply([BackendSpec("d", "http://d")])
    await fleet.members.first_checks()
    return fleet.members.backends["d"]


async def until(check: Callable[[], bool], seconds: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + seconds
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "never happened"
        await asyncio.sleep(0.02)


def read_errors(fleet: Fleet, what: str) -> float:
    total = 0.0
    for line in fleet.metrics.prometheus_text().decode().splitlines():
        if line.startswith("warmfleet_router_backend_read_errors_total{") and (
            f'warmfleet_read="{what}"' in line
        ):
            total += float(line.rsplit(" ", 1)[1])
    return total


def warnings_about(caplog: pytest.LogCaptureFixture, what: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and f"backend d: {what}:" in r.getMessage()
    ]


# -- background tasks: health, models, events, warm sets ------------------------------


async def test_a_status_whose_aliases_are_no_list_leaves_the_backend_routable(
    fleet: Fleet, fake: Fake, caplog: pytest.LogCaptureFixture
) -> None:
    fake.routes["/v1/status"] = lambda r: httpx.Response(200, json={"model": {"aliases": 5}})
    backend = await start(fleet)
    assert backend.health == "ready" and backend.models == frozenset({"m"})
    await until(lambda: read_errors(fleet, "status") >= 3)  # read again, counted each time
    assert "ValidationError" in backend.problems["status"]
    assert len(warnings_about(caplog, "status")) == 1  # logged once
    assert status_detail(fleet)["backends"][0]["problems"]["status"].startswith("ValidationError")
    plan = await fleet.planner.plan(CHAT, json.dumps({"model": "m", "messages": []}).encode(), {})
    assert plan.decision.backend == "d"
    fake.routes["/v1/status"] = lambda r: httpx.Response(200, json={"model": {"aliases": ["a"]}})
    await until(lambda: "status" not in backend.problems)
    assert backend.models == frozenset({"m", "a"})


async def test_an_unreadable_status_keeps_the_aliases_it_gave(fleet: Fleet, fake: Fake) -> None:
    """A /v1/status that cannot be read (too slow from a busy daemon, too large): its
    aliases (`default`) stay as its last status said, so requests for them find it."""
    fake.routes["/v1/status"] = lambda r: httpx.Response(200, json={"model": {"aliases": ["a"]}})
    backend = await start(fleet)
    assert backend.models == frozenset({"m", "a"})
    fake.routes["/v1/status"] = lambda r: httpx.Response(200, content=b"x" * (2 << 20))
    await until(lambda: "status" in backend.problems)  # too large to read: it cannot say
    await fleet.members.syncs["d"].read_models()
    assert backend.models == frozenset({"m", "a"})
    plan = await fleet.planner.plan(CHAT, json.dumps({"model": "a", "messages": []}).encode(), {})
    assert plan.decision.backend == "d"
    fake.routes["/v1/status"] = lambda r: httpx.Response(404)  # it says it has none
    await fleet.members.syncs["d"].read_models()
    assert backend.models == frozenset({"m"})


async def test_aliases_kept_through_an_unreadable_status_go_when_another_model_is_served(
    fleet: Fleet, fake: Fake
) -> None:
    """A daemon restarted with another model whose status cannot be read: the aliases of
    the model it no longer lists are not kept."""
    fake.routes["/v1/status"] = lambda r: httpx.Response(
        200, json={"model": {"id": "m", "aliases": ["m", "default"]}}
    )
    backend = await start(fleet)
    assert backend.models == frozenset({"m", "default"})
    fake.routes["/v1/status"] = lambda r: httpx.Response(200, content=b"x" * (2 << 20))
    await until(lambda: "status" in backend.problems)
    await fleet.members.syncs["d"].read_models()
    assert backend.models == frozenset({"m", "default"})  # the same model: kept
    fake.routes["/v1/models"] = lambda r: httpx.Response(200, json={"data": [{"id": "other"}]})
    await fleet.members.syncs["d"].read_models()
    assert backend.models == frozenset({"other"})


@pytest.mark.parametrize(
    "line",
    [
        b"[]",
        b'{"type": "stored", "seq": Infinity, "key": "%s"}' % KEY.encode(),
        b"x" * (64 << 10),  # one line longer than the line limit, no newline in sight
    ],
    ids=["a list", "seq Infinity", "an endless line"],
)
async def test_a_bad_event_line_means_a_new_snapshot_not_a_dead_task(
    fleet: Fleet, fake: Fake, caplog: pytest.LogCaptureFixture, line: bytes
) -> None:
    fake.routes["/v1/cache/events"] = lambda r: httpx.Response(200, content=lines(HELLO, line))
    backend = await start(fleet)
    await until(lambda: fake.asked.get("/v1/cache/snapshot", 0) >= 3, 10.0)
    assert fake.asked["/v1/cache/events"] >= 2  # followed again after each snapshot
    assert read_errors(fleet, "events") >= 2
    assert len(warnings_about(caplog, "events")) == 1
    assert backend.problems["events"].split(":")[0] in ("ValidationError", "TooLarge")
    # Fixed at the source: the index follows again and the reason goes.
    beat = {"type": "heartbeat", "seq": 0}
    fake.routes["/v1/cache/events"] = lambda r: httpx.Response(200, content=lines(HELLO, beat))
    await until(lambda: backend.index_mode == "following" and "events" not in backend.problems)


async def test_a_blocks_source_and_fields_the_router_does_not_know_are_followed(
    fleet: Fleet, fake: Fake, caplog: pytest.LogCaptureFixture
) -> None:
    """Stored events and snapshot blocks say where a block's KV came from (`source`,
    optional); a value or a field from a newer daemon changes nothing for the index."""
    first, second, third = (bytes([i]) * 16 for i in (1, 2, 3))
    snapshot = {
        "epoch": "e1", "seq": 0, "fingerprint": None,
        "blocks": [{"key": first.hex(), "start": 0, "end": 32, "source": "snapshot", "new": 1}],
    }  # fmt: skip
    events = [
        HELLO,
        {"type": "stored", "seq": 1, "key": second.hex(), "parent": first.hex(), "start": 32,
         "end": 64, "source": "peer"},
        {"type": "stored", "seq": 2, "key": third.hex(), "parent": second.hex(), "start": 64,
         "end": 96, "source": "from-a-newer-daemon", "lineage": {"via": "x"}},
    ]  # fmt: skip
    fake.routes["/v1/cache/snapshot"] = lambda r: httpx.Response(200, json=snapshot)
    fake.routes["/v1/cache/events"] = lambda r: httpx.Response(200, content=lines(*events))
    backend = await start(fleet)
    await until(lambda: fleet.index.size("d") == 3)
    assert backend.index_mode == "following" and "events" not in backend.problems
    assert fleet.index.tiers("d", third) == frozenset({"ram"})
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


async def test_endless_snapshots_models_and_warm_sets_stop_at_their_limits(
    fleet: Fleet, fake: Fake
) -> None:
    for path in ("/v1/cache/snapshot", "/v1/models", "/v1/warm-sets", "/v1/status"):
        fake.routes[path] = lambda r: httpx.Response(200, content=endless())
    backend = await start(fleet)
    await until(lambda: all(w in backend.problems for w in ("snapshot", "models", "warm-sets")))
    assert all("TooLarge" in backend.problems[w] for w in ("snapshot", "models", "warm-sets"))
    assert backend.health == "ready" and backend.index_mode == "resyncing"
    before = fake.asked["/v1/cache/snapshot"]
    await until(lambda: fake.asked["/v1/cache/snapshot"] > before)  # still trying


async def test_an_endless_readyz_marks_the_backend_down_with_the_reason(
    fleet: Fleet, fake: Fake
) -> None:
    fake.routes["/readyz"] = lambda r: httpx.Response(200, content=endless())
    backend = await start(fleet)
    assert backend.health == "down" and "TooLarge" in backend.health_detail
    fake.routes["/readyz"] = lambda r: httpx.Response(200, json={"status": "ready"})
    await until(lambda: backend.health == "ready")


async def test_a_trickling_event_stream_is_given_up_and_followed_again(
    fleet: Fleet, fake: Fake
) -> None:
    trickle = endless(b" ", pause=0.01)  # bytes keep coming, a line never ends
    fake.routes["/v1/cache/events"] = lambda r: httpx.Response(
        200, content=lines(HELLO, then=trickle)
    )
    backend = await start(fleet)
    await until(lambda: fake.asked.get("/v1/cache/events", 0) >= 3)
    assert "TooSlow" in backend.problems["events"]


async def test_a_flood_of_stored_events_stays_within_the_index_budget() -> None:
    index = BlockIndex(budget_bytes=1000 * ENTRY_BYTES)
    index.load_snapshot("honest", [(bytes([1, i]) * 8, False) for i in range(100)])
    for i in range(20_000):
        index.stored("liar", i.to_bytes(16, "big"), False)
    assert index.entries() <= 1000
    assert index.size("honest") == 100  # the flood costs only the backend that floods
    assert index.dropped_blocks("liar") >= 19_000 and index.dropped_blocks("honest") == 0


async def test_a_snapshot_over_the_budget_keeps_its_shallow_blocks() -> None:
    index = BlockIndex(budget_bytes=10 * ENTRY_BYTES)
    index.load_snapshot("d", [(i.to_bytes(16, "big"), False) for i in range(50)])
    assert index.size("d") <= 10
    assert index.predict("d", _run(5)) > 0  # the first blocks of the chain are still there


def _run(n: int) -> Any:
    from warmfleet_router.keys import RequestBlocks

    keys = tuple(i.to_bytes(16, "big") for i in range(n))
    return RequestBlocks(keys, tuple(range(4, 4 * n + 1, 4)), 4 * n)


# -- the proxy: response bodies, error bodies, deadlines -------------------------------


def chat(**extra: Any) -> bytes:
    return json.dumps(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], **extra}
    ).encode()


async def test_an_endless_response_body_is_passed_on_and_cut_at_the_limit(
    fleet: Fleet, fake: Fake
) -> None:
    fake.routes["/v1/chat/completions"] = lambda r: httpx.Response(
        200, headers={"content-type": "application/json"}, content=endless()
    )
    backend = await start(fleet)
    response = await forward(fleet, CHAT, chat(), {})
    assert response.status_code == 200  # its head has gone out: a cut is all that is left
    received = 0
    with pytest.raises(bounded.TooLarge):
        async for chunk in response.body_iterator:  # type: ignore[attr-defined]
            received += len(chunk)
    assert received <= PROXY.max_response_bytes  # never held whole: passed on as it came
    assert backend.in_flight == 0 and fleet.planner.decisions[-1]["outcome"] == "too_large"
    assert read_errors(fleet, "response") == 1


async def test_an_endless_error_body_is_read_only_up_to_its_limit(fleet: Fleet, fake: Fake) -> None:
    fake.routes["/v1/chat/completions"] = lambda r: httpx.Response(500, content=endless())
    backend = await start(fleet)
    response = await forward(fleet, CHAT, chat(), {})
    assert response.status_code == 502
    assert "oversized error body" in json.loads(bytes(response.body))["error"]["message"]
    assert backend.in_flight == 0


@pytest.mark.parametrize("content_type", ["application/json", "text/event-stream"])
async def test_a_trickling_backend_ends_at_the_request_timeout(
    fleet: Fleet, fake: Fake, content_type: str
) -> None:
    fake.routes["/v1/chat/completions"] = lambda r: httpx.Response(
        200, headers={"content-type": content_type}, content=endless(b" ", pause=0.05)
    )
    backend = await start(fleet)
    response = await forward(fleet, CHAT, chat(), {})
    assert response.status_code == 504
    assert json.loads(bytes(response.body))["error"]["code"] == "backend_timeout"
    assert backend.in_flight == 0 and fleet.planner.decisions[-1]["outcome"] == "timeout"


async def test_a_stream_past_the_request_timeout_ends_with_an_error_event(
    fleet: Fleet, fake: Fake
) -> None:
    event = b'data: {"choices":[{"index":0,"delta":{"content":"x"}}]}\n\n'
    fake.routes["/v1/chat/completions"] = lambda r: httpx.Response(
        200, headers={"content-type": "text/event-stream"}, content=endless(event, pause=0.05)
    )
    backend = await start(fleet)
    response = await forward(fleet, CHAT, chat(stream=True), {})
    assert response.status_code == 200
    body = b"".join([c async for c in response.body_iterator])  # type: ignore[attr-defined, misc]
    assert body.endswith(b"\n\n") and b'"code": "backend_timeout"' in body.rsplit(b"data: ", 1)[1]
    assert backend.in_flight == 0


# -- what the daemons refuse, refused without a backend ---------------------------------


async def test_deep_json_is_the_daemons_400(fleet: Fleet, fake: Fake) -> None:
    await start(fleet)
    response = await forward(fleet, CHAT, b"[" * 100_000 + b"]" * 100_000, {})
    assert response.status_code == 400
    assert json.loads(bytes(response.body))["error"]["message"] == (
        "There was an error parsing the body"
    )
    assert "/v1/chat/completions" not in fake.asked


@pytest.mark.parametrize("prompt", [[-1], [4294967296], [[7, -2]], [1, 2**40]])
async def test_token_ids_that_cannot_be_keyed_are_the_daemons_400(
    fleet: Fleet, fake: Fake, prompt: list[Any]
) -> None:
    await start(fleet)
    body = json.dumps({"model": "m", "prompt": prompt}).encode()
    response = await forward(fleet, COMPLETION, body, {})
    assert response.status_code == 400
    error = json.loads(bytes(response.body))["error"]
    assert (error["param"], error["type"]) == ("prompt", "invalid_request_error")
    assert error["message"] == "prompt token ids must be in [0, 4294967296)"
    assert "/v1/completions" not in fake.asked


async def test_an_unknown_model_is_a_404_before_its_token_ids_are_judged(
    fleet: Fleet, fake: Fake
) -> None:
    await start(fleet)  # as a daemon checks: the model first
    response = await forward(
        fleet, COMPLETION, json.dumps({"model": "x", "prompt": [-1]}).encode(), {}
    )
    assert response.status_code == 404


async def test_a_prompt_over_every_context_is_refused_before_it_is_tokenized(
    fleet: Fleet, fake: Fake, monkeypatch: pytest.MonkeyPatch
) -> None:
    layout = tiny_layout()
    fake.routes["/v1/cache/layout"] = lambda r: httpx.Response(
        200, content=layout.model_dump_json()
    )
    fake.routes["/v1/cache/snapshot"] = lambda r: httpx.Response(
        200, json={"epoch": "e1", "seq": 0, "fingerprint": layout.fingerprint, "blocks": []}
    )
    fake.routes["/v1/status"] = lambda r: httpx.Response(
        200, json={"model": {"aliases": ["m"], "context_length": 64}}
    )
    backend = await start(fleet)
    await until(lambda: backend.fingerprint == layout.fingerprint and backend.context_length == 64)
    encoded: list[str] = []
    from warmfleet_common.prompts import PromptBuilder

    real = PromptBuilder._encode

    def counted(self: PromptBuilder, text: str, **kwargs: Any) -> list[int]:
        encoded.append(text)
        return real(self, text, **kwargs)

    monkeypatch.setattr(PromptBuilder, "_encode", counted)
    from warmfleet_common.pieces import PieceEncoder

    pieces = PieceEncoder.encode_marked  # what a session's continued chat tokenizes with

    def counted_pieces(self: PieceEncoder, text: str, marks: Any) -> list[int]:
        encoded.append(text)
        return pieces(self, text, marks)

    monkeypatch.setattr(PieceEncoder, "encode_marked", counted_pieces)
    small = await fleet.planner.plan(CHAT, chat(), {})
    assert small.blocks["d"].keys and encoded  # keyed as usual
    encoded.clear()
    big = json.dumps({"model": "m", "messages": [{"role": "user", "content": "a" * 50_000}]})
    response = await forward(fleet, CHAT, big.encode(), {})
    assert response.status_code == 400 and not encoded
    error = json.loads(bytes(response.body))["error"]
    assert (error["code"], error["param"]) == ("context_length_exceeded", "messages")
    assert error["message"].startswith("This model's maximum context length is 64 tokens.")


# -- sessions ---------------------------------------------------------------------------


async def test_session_keys_are_hashed_past_the_limit_and_the_table_has_a_byte_budget() -> None:
    long = "user@example.com/" * 4000  # 68 KB
    assert capped("short") == "short" and len(capped(long)) < MAX_KEY_CHARS
    table = SessionTable(budget_bytes=100_000)
    for i in range(10_000):
        table.served(f"{long}{i}", "d0")
    assert table.size_bytes <= 100_000 and table.forgotten > 9_000
    assert table.get(f"{long}9999") == "d0"


async def test_a_backend_that_is_still_starting_is_no_warning_until_it_lasts(
    fleet: Fleet, fake: Fake, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A daemon loading its model answers 503: expected while the fleet starts, said once
    at INFO; if it never becomes ready within the start grace, a warning."""
    caplog.set_level(logging.INFO)
    loading = lambda r: httpx.Response(503, json={"status": "loading"})  # noqa: E731
    fake.routes["/readyz"] = fake.routes["/v1/cache/snapshot"] = loading
    monkeypatch.setattr(sync, "START_GRACE_S", 0.5)
    await start(fleet)
    await until(lambda: read_errors(fleet, "snapshot") >= 3)  # counted each time
    starting = [r for r in caplog.records if "backend d: snapshot:" in r.getMessage()]
    assert [r.levelno for r in starting] == [logging.INFO]
    assert "not ready yet" in starting[0].getMessage()
    await asyncio.sleep(0.6)  # past the grace, still not ready: now it is trouble
    await until(lambda: len(warnings_about(caplog, "snapshot")) == 1)


async def test_the_retry_goes_to_the_first_fallback_still_usable(fleet: Fleet, fake: Fake) -> None:
    """A rolling restart drains several backends at once: when the one a request went to
    fails before its first byte and the next fallback is draining too, the retry skips
    it for one that is ready (it used to give up with a 502)."""

    def chat_route(request: httpx.Request) -> Any:
        if request.url.host == "a":
            raise httpx.ConnectError("the connection was reset", request=request)

        async def body() -> AsyncIterator[bytes]:
            yield json.dumps({"choices": [], "usage": {"prompt_tokens": 3}}).encode()

        return httpx.Response(200, headers={"content-type": "application/json"}, content=body())

    def readyz(request: httpx.Request) -> Any:
        if request.url.host == "b":
            return httpx.Response(503, json={"status": "draining"})
        return httpx.Response(200, json={"status": "ready"})

    fake.routes["/v1/chat/completions"] = chat_route
    fake.routes["/readyz"] = readyz
    await fleet.members.apply([BackendSpec(n, f"http://{n}") for n in "abc"])
    await fleet.members.first_checks()
    await until(lambda: not fleet.members.backends["b"].usable)
    plan = fleet.planner.plan

    async def a_then_b(*args: Any) -> Any:
        made = await plan(*args)
        made.decision = Decision("a", "prefix", 0, ("b", "c"))
        return made

    fleet.planner.plan = a_then_b  # type: ignore[method-assign]
    response = await forward(fleet, CHAT, chat(), {})
    assert response.status_code == 200
    assert response.headers["x-warmfleet-backend"] == "c"
    assert response.headers["x-warmfleet-route-reason"] == "failover"
