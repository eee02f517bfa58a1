"""`--public-url`: behind a proxy that rewrites `Host` or adds a path prefix, a peer grant
names the URL the fleet knows the daemon by, not the one the request arrives with; the
daemon honours grants for its public URLs as for the URL it was reached at, and only
those (a grant for another node sharing its token stays refused)."""

from __future__ import annotations

import argparse

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from support.engine import model
from warmfleet_common.grants import GRANT_HEADER, issue_grant
from warmfleet_daemon.api.app import create_app
from warmfleet_daemon.cli import add_serve_arguments, settings_overrides
from warmfleet_daemon.engine.core import Engine
from warmfleet_daemon.engine.requests import EngineConfig
from warmfleet_daemon.settings import DaemonSettings

TOKEN = "node-a-s3cret"
PUBLIC = "https://mac-a.example.com/warmfleet"


def client(**settings: object) -> TestClient:
    engine = Engine(model("tiny-random"), EngineConfig(block_size=32, cache_budget_bytes=1 << 26))
    app = create_app(
        DaemonSettings(model="tiny-random", admin_token=TOKEN, **settings), engine=engine
    )
    return TestClient(app)  # its requests carry `Host: testserver`


def fingerprint(c: TestClient, grant: str) -> tuple[int, str]:
    r = c.get("/v1/cache/fingerprint", headers={GRANT_HEADER: grant})
    return r.status_code, r.json().get("error", {}).get("message", "")


def test_a_grant_for_a_public_url_is_honoured_and_one_for_another_node_is_not() -> None:
    with client(public_url=[PUBLIC + "/"]) as c:
        assert fingerprint(c, issue_grant(TOKEN, PUBLIC))[0] == 200
        assert (
            fingerprint(c, issue_grant(TOKEN, "HTTPS://Mac-A.example.com:443/warmfleet/"))[0] == 200
        )
        assert fingerprint(c, issue_grant(TOKEN, "http://testserver"))[0] == 200  # its Host
        status, why = fingerprint(c, issue_grant(TOKEN, "https://mac-b.example.com/warmfleet"))
        assert status == 401 and "not signed for this daemon" in why
        status, why = fingerprint(c, issue_grant(TOKEN, "https://mac-a.example.com"))  # no prefix
        assert status == 401 and "not signed for this daemon" in why
        # A grant still opens only the read-only peer routes.
        r = c.get("/v1/warm-sets", headers={GRANT_HEADER: issue_grant(TOKEN, PUBLIC)})
        assert r.status_code == 401


def test_without_it_the_proxy_url_is_refused() -> None:
    with client() as c:
        status, why = fingerprint(c, issue_grant(TOKEN, PUBLIC))
        assert status == 401 and "not signed for this daemon" in why


def test_a_public_url_must_be_an_http_base_url_on_a_daemon_with_a_token() -> None:
    with pytest.raises(ValidationError, match="--public-url takes http"):
        DaemonSettings(model="tiny-random", admin_token=TOKEN, public_url=["mac-a:8000"])
    with pytest.raises(ValidationError, match="--public-url only applies with an admin token"):
        DaemonSettings(model="tiny-random", admin_token=None, public_url=[PUBLIC])


def serve_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    return parser.parse_args(list(argv))


def test_the_flags_and_registers_advertise_url_become_public_urls(monkeypatch) -> None:
    monkeypatch.delenv("WARMFLEET_ADMIN_TOKEN", raising=False)
    one = settings_overrides(serve_args("--public-url", PUBLIC, "--public-url", "http://b:1"))
    assert one["public_url"] == [PUBLIC, "http://b:1"]
    # --register's WarmNode URL is what the operator signs its grants for (with a token).
    registered = ["--register", "mac-a", "--advertise-url", "http://10.0.0.7:8000"]
    with_token = serve_args(*registered, "--admin-token-file", "/etc/warmfleet/token")
    assert settings_overrides(with_token)["public_url"] == ["http://10.0.0.7:8000"]
    assert "public_url" not in settings_overrides(serve_args(*registered))  # no grants then
    monkeypatch.setenv("WARMFLEET_ADMIN_TOKEN", TOKEN)
    assert settings_overrides(serve_args(*registered))["public_url"] == ["http://10.0.0.7:8000"]
    assert "public_url" not in settings_overrides(serve_args("--advertise-url", "http://x:1"))
