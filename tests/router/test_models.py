"""Requests go only to backends that serve the requested model: the router learns each
backend's model names (its /v1/models, and a warmfleet daemon's aliases from /v1/status)
with its health checks; a model nobody serves is a 404 `model_not_found`, as a daemon
answers it. Fake backends over httpx.MockTransport; exact choices asserted."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import pytest_asyncio

from support.router import mocked_fleet
from warmfleet_router.backend import BackendSpec
from warmfleet_router.fleet import Fleet
from warmfleet_router.options import RouterOptions
from warmfleet_router.policy import ModelNotFound, NoBackendReady, RoutingError
from warmfleet_router.proxy import forward
from warmfleet_router.routes import CHAT
from warmfleet_router.status import status_detail
from warmfleet_router.sync import SyncOptions

pytestmark = pytest.mark.asyncio


class Backends:
    """Fake servers by host: `models[host]` is what its /v1/models lists (None: an empty
    body, as mlx_lm.server without a Hugging Face cache answers), `aliases[host]` what
    its /v1/status adds (None: no such route: not a warmfleet daemon)."""

    def __init__(self) -> None:
        self.models: dict[str, list[str] | None] = {
            "llama": ["llama-3"],
            "qwen": ["qwen-2"],
            "stuck": ["llama-3"],
        }
        self.aliases: dict[str, list[str] | None] = {
            "llama": ["default", "llama-3", "/models/llama.gguf"],
            "qwen": None,
        }
        self.ready: dict[str, bool] = {}
        self.chats: list[str] = []

    def __call__(self, request: httpx.Request) -> Any:
        host, path = request.url.host, request.url.path
        if host == "stuck" and path == "/v1/chat/completions":
            return asyncio.Event().wait()  # never answers (MockTransport awaits it)
        if path == "/readyz":
            ok = self.ready.get(host, True)
            return httpx.Response(200 if ok else 503, json={"status": "ready" if ok else "x"})
        if path == "/v1/models":
            ids = self.models[host]
            if ids is None:
                return httpx.Response(200, content=b"")
            return httpx.Response(200, json={"object": "list", "data": [{"id": i} for i in ids]})
        if path == "/v1/status" and self.aliases.get(host) is not None:
            return httpx.Response(200, json={"model": {"id": "x", "aliases": self.aliases[host]}})
        if path == "/v1/chat/completions":
            self.chats.append(host)
            usage = {"prompt_tokens": 9, "prompt_tokens_details": {"cached_tokens": 0}}
            model = json.loads(request.content)["model"]
            answer = json.dumps({"model": model, "choices": [], "usage": usage})
            return httpx.Response(
                200, headers={"content-type": "application/json"}, content=_body(answer.encode())
            )
        return httpx.Response(404, json={"error": {"message": "no such route"}})


async def _body(data: bytes) -> AsyncIterator[bytes]:
    """A response body as a stream, as a real connection delivers it (the proxy relays)."""
    yield data


@pytest_asyncio.fixture
async def backends() -> Backends:
    return Backends()


@pytest_asyncio.fixture
async def fleet(backends: Backends) -> AsyncIterator[Fleet]:
    options = RouterOptions(sync=SyncOptions(health_interval=3600, warm_sets_interval=3600))
    async with mocked_fleet(options, backends) as fleet:
        yield fleet


async def start(fleet: Fleet, *hosts: str) -> None:
    await fleet.members.apply([BackendSpec(h, f"http://{h}") for h in hosts])
    await fleet.members.first_checks()


def chat(model: str) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}]}


def encoded(body: dict[str, Any]) -> bytes:
    return json.dumps(body).encode()


async def choice(fleet: Fleet, model: str) -> tuple[str, tuple[str, ...]]:
    plan = await fleet.planner.plan(CHAT, encoded(chat(model)), {})
    return plan.decision.backend, plan.decision.fallbacks


async def test_each_request_goes_to_a_backend_serving_its_model(fleet: Fleet) -> None:
    await start(fleet, "llama", "qwen")
    status = {b["name"]: b["models"] for b in status_detail(fleet)["backends"]}
    assert status == {
        "llama": ["/models/llama.gguf", "default", "llama-3"],
        "qwen": ["qwen-2"],
    }
    for _ in range(4):  # never the other one, not even as the failover
        assert await choice(fleet, "qwen-2") == ("qwen", ())
        assert await choice(fleet, "llama-3") == ("llama", ())
        assert await choice(fleet, "default") == ("llama", ())  # a daemon's alias


async def test_a_model_nobody_serves_is_a_404_like_the_daemons(
    fleet: Fleet, backends: Backends
) -> None:
    await start(fleet, "llama", "qwen")
    with pytest.raises(ModelNotFound):
        await fleet.planner.plan(CHAT, encoded(chat("gpt-9")), {})

    raw = json.dumps(chat("gpt-9")).encode()
    response = await forward(fleet, CHAT, raw, {})
    assert response.status_code == 404
    assert json.loads(bytes(response.body)) == {
        "error": {
            "message": "The model `gpt-9` does not exist.",
            "type": "not_found_error",
            "param": "model",
            "code": "model_not_found",
        }
    }
    assert backends.chats == []  # nothing was sent anywhere

    raw = json.dumps(chat("qwen-2")).encode()
    response = await forward(fleet, CHAT, raw, {})
    assert response.status_code == 200 and response.headers["x-warmfleet-backend"] == "qwen"


async def test_a_served_model_whose_backends_are_down_is_a_503(
    fleet: Fleet, backends: Backends
) -> None:
    await start(fleet, "llama", "qwen")
    backends.ready["qwen"] = False
    await fleet.members.syncs["qwen"].check_health()
    with pytest.raises(NoBackendReady):
        await fleet.planner.plan(CHAT, encoded(chat("qwen-2")), {})
    assert await choice(fleet, "llama-3") == ("llama", ())


async def test_backends_that_list_no_models_get_only_what_nobody_claims(
    fleet: Fleet, backends: Backends
) -> None:
    backends.models["opaque"] = None  # an empty /v1/models body: it cannot say
    await start(fleet, "llama", "opaque")
    assert await choice(fleet, "llama-3") == ("llama", ())
    assert await choice(fleet, "mistral") == ("opaque", ())  # it may serve it: it decides


async def test_a_backend_back_with_another_model_is_read_again(
    fleet: Fleet, backends: Backends
) -> None:
    await start(fleet, "llama", "qwen")
    backends.ready["qwen"] = False
    await fleet.members.syncs["qwen"].check_health()
    backends.ready["qwen"] = True
    backends.models["qwen"] = ["qwen-3"]
    await fleet.members.syncs["qwen"].check_health()
    assert await choice(fleet, "qwen-3") == ("qwen", ())
    with pytest.raises(RoutingError):
        await fleet.planner.plan(CHAT, encoded(chat("qwen-2")), {})


async def test_predictions_for_backends_without_events_are_labelled_history(
    fleet: Fleet,
) -> None:
    """Guesses from routing history are counted apart from event-backed predictions, so
    they neither inflate nor deflate the index's accuracy."""
    await start(fleet, "llama")
    raw = json.dumps(chat("llama-3")).encode()
    response = await forward(fleet, CHAT, raw, {})
    assert response.status_code == 200
    assert fleet.planner.decisions[-1]["prediction_source"] == "history"
    samples = [
        line
        for line in fleet.metrics.prometheus_text().decode().splitlines()
        if line.startswith("warmfleet_router_predictions_total{")
    ]
    assert len(samples) == 1
    assert 'warmfleet_prediction_source="history"' in samples[0]
    assert 'warmfleet_prediction="exact"' in samples[0]


async def test_a_client_gone_before_the_response_leaves_nothing_in_flight(
    fleet: Fleet,
) -> None:
    await start(fleet, "stuck")
    raw = json.dumps(chat("llama-3")).encode()
    task = asyncio.create_task(forward(fleet, CHAT, raw, {}))
    for _ in range(100):
        await asyncio.sleep(0.01)
        if fleet.members.backends["stuck"].in_flight:
            break
    assert fleet.members.backends["stuck"].in_flight == 1
    task.cancel()  # as Starlette does when the client disconnects
    with pytest.raises(asyncio.CancelledError):
        await task
    assert fleet.members.backends["stuck"].in_flight == 0
    assert fleet.planner.decisions[-1]["outcome"] == "cancelled"
    # Nothing is left in prefill there: the same request again does not contend with it.
    plan = await fleet.planner.plan(CHAT, encoded(chat("llama-3")), {})
    assert not fleet.index.take_off("stuck", plan.blocks["stuck"]).contended
