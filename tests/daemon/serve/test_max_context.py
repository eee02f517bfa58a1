"""`warmfleet serve --max-context N`: the daemon serves N tokens of context, beyond the
model's configured length with a warning in the log."""

from __future__ import annotations

import logging

import httpx
import pytest

from support.engine import model
from support.processes import start_daemon
from warmfleet_daemon.runtime.assembly import with_context


def test_beyond_the_configured_context_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    tiny = model("tiny-random")
    with caplog.at_level(logging.WARNING):
        longer = with_context(tiny, 16384)
    assert longer.context_length == 16384 and tiny.context_length == 8192
    assert "beyond the 8192 tokens" in caplog.text
    assert with_context(tiny, None) is tiny


def test_the_daemon_serves_the_context_it_was_given() -> None:
    daemon = start_daemon(
        "--model", "tiny-random", "--max-context", "12000", "--log-level", "warning"
    )
    try:
        card = httpx.get(f"{daemon.url}/v1/models").json()["data"][0]
        assert card["max_model_len"] == 12000
        assert "--max-context" in daemon.log()
    finally:
        daemon.stop()
