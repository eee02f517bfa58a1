"""The router's OpenAPI document describes its real answers, the proxied routes' bodies
included: schemathesis generates requests for every operation (valid and invalid), runs
them against the router in process in front of a real tiny daemon, and checks that none
is a 5xx, every status code is documented for its operation and every response matches
its documented schema (the daemon's 400s, 404s and 413s come through the router)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import schemathesis
from schemathesis.python import asgi

from support.openapi import CASES, CHECKS, cap
from support.processes import Daemon
from warmfleet_router.app import create_app
from warmfleet_router.backend import BackendSpec
from warmfleet_router.options import RouterOptions

MAX_TOKENS = 4
_backend: list[str] = []  # the daemon's URL, known once its fixture has run


class TinyDaemonSource:
    """The session's tiny daemon, once its URL is known: schemathesis starts the app's
    lifespan when it loads the document, before any fixture has run."""

    async def specs(self) -> list[BackendSpec]:
        return [BackendSpec("tiny", url) for url in _backend]

    async def changes(self) -> AsyncIterator[list[BackendSpec]]:
        yield []
        while not _backend:  # noqa: ASYNC110 (set from a fixture on another thread)
            await asyncio.sleep(0.05)
        yield await self.specs()
        await asyncio.Event().wait()

    async def close(self) -> None:
        return None


# Built at import: pytest 9 breaks schemathesis' lazy fixture loading; schemathesis runs
# the lifespan itself on the first case, after the fixture below has set the URL.
app = create_app(TinyDaemonSource(), RouterOptions())
schema = schemathesis.openapi.from_asgi("/openapi.json", app)


@pytest.fixture(scope="module", autouse=True)
def _daemon(tiny_daemon: Daemon) -> Iterator[None]:
    _backend[:] = [tiny_daemon.url]
    deadline = time.monotonic() + 60
    with asgi.get_client(app) as client:  # the router's own lifespan, as schemathesis runs it
        while client.get("http://localhost/readyz").status_code != 200:
            assert time.monotonic() < deadline, "the router never found the daemon ready"
            time.sleep(0.1)
    yield


@schema.parametrize()
@CASES
def test_every_operation_answers_as_documented(case: Any) -> None:
    cap(case, ("max_tokens", "max_completion_tokens", "max_output_tokens", "n"), MAX_TOKENS)
    case.call_and_validate(checks=CHECKS)


def test_the_document_has_the_proxied_bodies_and_codes() -> None:
    document = app.openapi()
    post = document["paths"]["/v1/chat/completions"]["post"]
    body = post["requestBody"]["content"]["application/json"]["schema"]
    assert body == {"$ref": "#/components/schemas/ChatBody"}
    assert {"messages", "model"} <= set(document["components"]["schemas"]["ChatBody"]["required"])
    assert {"200", "400", "404", "413", "502", "503", "504"} <= set(post["responses"])
    assert "422" not in post["responses"]
