"""The router's HTTP front over real HTTP (uvicorn in threads) with a fake backend: the
status's detail is the admin's and never shows a session key, a client that leaves
cancels the backend request, the router's CPU per request is a metric, and an empty
admin token file stops `warmfleet router` as it stops `warmfleet serve`."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from support.processes import serving
from warmfleet_router.app import create_app
from warmfleet_router.discovery import StaticSource
from warmfleet_router.options import RouterOptions

TOKEN = "router-app-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SESSION = "alice@example.com"


class Backend:
    """A daemon that answers chats at once, except those saying "hang", which it holds
    until the router closes the connection (and notes that it did)."""

    def __init__(self) -> None:
        self.closed = threading.Event()

    def app(self) -> Starlette:
        async def readyz(_: Request) -> JSONResponse:
            return JSONResponse({"status": "ready"})

        async def models(_: Request) -> JSONResponse:
            return JSONResponse({"object": "list", "data": [{"id": "m"}]})

        async def chat(request: Request) -> JSONResponse:
            body = await request.json()
            if body["messages"][0]["content"] == "hang":
                while not await request.is_disconnected():  # noqa: ASYNC110 (Starlette polls)
                    await asyncio.sleep(0.02)
                self.closed.set()
            usage = {"prompt_tokens": 5, "prompt_tokens_details": {"cached_tokens": 0}}
            return JSONResponse({"choices": [], "usage": usage})

        return Starlette(
            routes=[
                Route("/readyz", readyz),
                Route("/v1/models", models),
                Route("/v1/chat/completions", chat, methods=["POST"]),
            ]
        )


@pytest.fixture(scope="module")
def backend() -> Iterator[tuple[Backend, str]]:
    fake = Backend()
    with serving(fake.app()) as url:  # type: ignore[arg-type]
        yield fake, url


@pytest.fixture(scope="module")
def router(backend: tuple[Backend, str]) -> Iterator[str]:
    options = RouterOptions(admin_token=TOKEN)
    with serving(create_app(StaticSource([backend[1]], None), options)) as url:
        yield url


def ask(router: str, content: str, **headers: str) -> httpx.Response:
    body = {"model": "m", "messages": [{"role": "user", "content": content}]}
    return httpx.post(f"{router}/v1/chat/completions", json=body, headers=headers, timeout=10)


def status(router: str, **headers: str) -> httpx.Response:
    return httpx.get(f"{router}/v1/router/status", headers=headers, timeout=10)


def test_the_status_detail_is_the_admins_and_never_shows_session_keys(
    router: str, backend: tuple[Backend, str]
) -> None:
    assert ask(router, "hi", **{"x-session-affinity": SESSION}).status_code == 200
    public = status(router)
    assert public.status_code == 200
    assert public.json() == {
        "policy": "prefix",
        "backends": 1,
        "ready_backends": 1,
        "in_flight": 0,
        "index_blocks": 2,  # history: the request's two message blocks
        "sessions": 1,
        "decisions": public.json()["decisions"],
    }
    assert backend[1] not in public.text and SESSION not in public.text
    assert status(router, Authorization="Bearer wrong").status_code == 403
    assert status(router, Authorization="Basic x").status_code == 401
    detail = status(router, **AUTH)
    assert detail.status_code == 200 and SESSION not in detail.text
    assert detail.json()["backends"][0]["url"] == backend[1]
    sessions = {d["session"] for d in detail.json()["decisions"] if d["session"]}
    assert len(sessions) == 1 and len(next(iter(sessions))) == 16  # a keyed hash


def test_a_client_that_leaves_cancels_the_backend_request(
    router: str, backend: tuple[Backend, str]
) -> None:
    fake, _ = backend
    fake.closed.clear()
    with pytest.raises(httpx.ReadTimeout):
        ask_timeout = httpx.Timeout(5.0, read=0.5)
        body = {"model": "m", "messages": [{"role": "user", "content": "hang"}]}
        httpx.post(f"{router}/v1/chat/completions", json=body, timeout=ask_timeout)
    assert fake.closed.wait(10), "the backend request was never cancelled"
    deadline = time.monotonic() + 10
    while status(router, **AUTH).json()["backends"][0]["in_flight"]:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    decision = status(router, **AUTH).json()["decisions"][0]
    assert decision["outcome"] == "cancelled"


def test_the_routers_cpu_per_request_is_a_metric(router: str) -> None:
    assert ask(router, "count me").status_code == 200
    text = httpx.get(f"{router}/metrics", timeout=10).text
    samples = {
        line.split("{")[0]: line
        for line in text.splitlines()
        if line.startswith(("warmfleet_router_request_cpu_time", "process_cpu_time"))
    }
    assert "warmfleet_router_request_cpu_time_seconds_total" in samples
    assert 'warmfleet_stage="prepare"' in text and 'warmfleet_stage="route"' in text
    assert "process_cpu_time_seconds_total" in samples


def test_the_routers_memory_and_its_indexs_bytes_are_metrics(router: str) -> None:
    assert ask(router, "remember me").status_code == 200
    text = httpx.get(f"{router}/metrics", timeout=10).text
    values = {
        line.split(" ")[0].split("{")[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(("warmfleet_router_index_memory", "process_memory_usage"))
    }
    index = status(router, **AUTH).json()["index"]["estimated_bytes"]
    assert index > 0 and values["warmfleet_router_index_memory_bytes"] == index
    assert values["process_memory_usage_bytes"] > 20 << 20  # a Python process's RSS


def test_the_routers_decision_time_is_a_histogram(router: str) -> None:
    assert ask(router, "time me").status_code == 200
    text = httpx.get(f"{router}/metrics", timeout=10).text
    counts = [
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("warmfleet_router_decision_duration_seconds_count")
    ]
    assert counts and sum(counts) >= 1
    assert 'le="0.005"' in text  # milliseconds resolved: the fleet-scale target is 5 ms


def test_an_empty_admin_token_file_stops_the_router_with_exit_code_2(tmp_path: Path) -> None:
    empty = tmp_path / "token"
    empty.write_text("\n")
    done = subprocess.run(
        [sys.executable, "-m", "warmfleet_cli", "router", "--backend", "http://127.0.0.1:9",
         "--admin-token-file", str(empty)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert "is empty" in done.stdout + done.stderr


def test_an_unexpected_error_on_a_proxied_route_is_a_json_500(
    router: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The proxied routes skip FastAPI's middleware: their errors are still the API's
    JSON, and the connection stays usable."""
    from warmfleet_router import app as router_app

    async def broken(*_: object) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(router_app, "forward", broken)
    with httpx.Client(base_url=router, timeout=10) as client:
        body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "x"}]}
        answer = client.post("/v1/messages", json=body)
        assert answer.status_code == 500
        assert answer.json()["type"] == "error" and answer.json()["error"]["type"] == "api_error"
        chat = client.post("/v1/chat/completions", json={"model": "m", "messages": []})
        assert chat.status_code == 500 and chat.json()["error"]["code"] == "internal_error"
        assert client.get("/readyz").status_code == 200  # the same connection, still usable
        assert client.get("/v1/chat/completions").status_code == 405  # FastAPI's, as before
