"""The access log without the polls: the GETs every component makes of another every
few seconds (health, status, cache snapshots and events, warm sets) are left out, every
other request stays."""

from __future__ import annotations

import logging

import pytest

from warmfleet_common.logs import WithoutPolls


def access(method: str, path: str) -> logging.LogRecord:
    """A record as uvicorn's access logger makes it."""
    args = ("127.0.0.1:5000", method, path, "1.1", 200)
    return logging.LogRecord(
        "uvicorn.access", logging.INFO, "", 0, '%s - "%s %s HTTP/%s" %d', args, None
    )


@pytest.mark.parametrize(
    ("method", "path", "kept"),
    [
        ("GET", "/readyz", False),
        ("GET", "/healthz", False),
        ("GET", "/readyz?warm=1", False),
        ("GET", "/v1/status", False),
        ("GET", "/v1/cache/events?after=3&epoch=e", False),
        ("GET", "/v1/cache/snapshot", False),
        ("GET", "/v1/warm-sets/default/agents", False),
        ("GET", "/metrics", False),
        ("PUT", "/v1/warm-sets/default/agents", True),  # a change, not a poll
        ("POST", "/v1/chat/completions", True),
        ("GET", "/v1/cache/blocks?keys=ab", True),  # a peer's copy
        ("GET", "/v1/statusx", True),
    ],
)
def test_polls_are_left_out(method: str, path: str, kept: bool) -> None:
    assert WithoutPolls().filter(access(method, path)) is kept
