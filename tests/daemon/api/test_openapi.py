"""The OpenAPI document describes the real responses: schemathesis generates requests
for every operation (valid and invalid), runs them against the app in process on the
tiny model, and checks that none is a 5xx, every status code is documented for its
operation and every response matches the schema documented for its status code."""

from __future__ import annotations

from typing import Any

import pytest
import schemathesis

from support.engine import model
from support.openapi import CASES, CHECKS, cap
from warmfleet_daemon.api.app import create_app
from warmfleet_daemon.engine.core import Engine
from warmfleet_daemon.engine.requests import EngineConfig
from warmfleet_daemon.settings import DaemonSettings

TOKEN = "schemathesis-token"
MAX_TOKENS = 4  # generated bodies may ask for thousands: the checks need none of them


# Built at import: pytest 9 breaks schemathesis' lazy fixture loading. schemathesis runs
# the app's lifespan itself (once per process), which attaches this engine.
engine = Engine(model("tiny-random"), EngineConfig(block_size=32, cache_budget_bytes=64 << 20))
app = create_app(
    DaemonSettings(model="tiny-random", admin_token=TOKEN, default_max_tokens=MAX_TOKENS),
    engine=engine,
)
schema = schemathesis.openapi.from_asgi("/openapi.json", app)


@pytest.fixture(scope="module", autouse=True)
def _shut_down() -> Any:
    """schemathesis never runs the lifespan's end: shut the daemon down here, so no
    engine or transfer thread is inside mlx when the interpreter exits (that aborts it)."""
    yield
    app.state.daemon.shutdown()


# The router's cache-event feed is an endless NDJSON stream (heartbeats until the
# subscriber leaves): schemathesis can only wait for it to end. Its answers are checked
# in tests/daemon/serve/test_cache_events.py and test_the_event_feed_answers_as_documented.
@schema.exclude(path="/v1/cache/events").parametrize()
@CASES
def test_every_operation_answers_as_documented(case: Any) -> None:
    cap(case, ("max_tokens", "max_completion_tokens", "max_output_tokens"), MAX_TOKENS)
    case.call_and_validate(headers={"Authorization": f"Bearer {TOKEN}"}, checks=CHECKS)


def test_the_document_names_the_real_error_codes() -> None:
    document = app.openapi()
    assert "HTTPValidationError" not in str(document)
    paths = document["paths"]

    def codes(path: str, method: str) -> set[str]:
        return set(paths[path][method]["responses"])

    assert codes("/readyz", "get") == {"200", "400", "503"}
    assert {"400", "404", "413", "499", "503"} <= codes("/v1/chat/completions", "post")
    assert {"400", "409", "413", "422", "503"} <= codes("/v1/warm-sets/{namespace}/{name}", "put")
    assert "422" not in codes("/v1/chat/completions", "post")
    assert {"400", "404", "413", "499", "503"} <= codes("/v1/messages", "post")
    error = paths["/v1/messages"]["post"]["responses"]["400"]["content"]["application/json"]
    assert error["schema"]["$ref"].endswith("/AnthropicErrorResponse")
    streamed = paths["/v1/chat/completions"]["post"]["responses"]["200"]["content"]
    assert set(streamed) == {"application/json", "text/event-stream"}
