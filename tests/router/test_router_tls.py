"""The router over TLS, as processes: it serves HTTPS, verifies a daemon that requires
client certificates (mTLS) with the CA and presents its own, so it follows the daemon's
cache events and routes by them; with `--tls-client-ca` its status's detail needs a
client certificate too, while inference does not; a daemon it cannot verify is down,
with the reason in the status."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from support.processes import Daemon, start_daemon, start_router
from support.router import AUTH, TOKEN, wait_for
from warmfleet_cli.local_ca import CertFiles, make_local_ca


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> CertFiles:
    return make_local_ca(tmp_path_factory.mktemp("ca"))


def tls(ca: CertFiles, *, client_ca: bool) -> list[str]:
    args = ["--tls-cert", str(ca.cert), "--tls-key", str(ca.key), "--tls-ca", str(ca.ca)]
    return args + (["--tls-client-ca", str(ca.ca)] if client_ca else [])


@pytest.fixture(scope="module")
def daemon(ca: CertFiles) -> Iterator[Daemon]:
    d = start_daemon(
        "--model", "tiny-random", "--block-size", "32", *tls(ca, client_ca=True),
        env={"WARMFLEET_ADMIN_TOKEN": TOKEN},
    )  # fmt: skip
    yield d
    d.stop()


@pytest.fixture(scope="module")
def router(
    daemon: Daemon, ca: CertFiles, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Daemon]:
    token = tmp_path_factory.mktemp("router") / "token"
    token.write_text(TOKEN)
    r = start_router(
        "--backend", daemon.url, "--admin-token-file", str(token), *tls(ca, client_ca=True)
    )
    yield r
    r.stop()


def mutual(ca: CertFiles) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(ca.ca))
    context.load_cert_chain(str(ca.cert), str(ca.key))
    return context


def test_the_router_follows_a_mutual_tls_daemon_and_routes_by_its_events(
    router: Daemon, ca: CertFiles
) -> None:
    def status() -> dict:
        answer = httpx.get(f"{router.url}/v1/router/status", headers=AUTH, verify=mutual(ca))
        return dict(answer.json())

    wait_for(lambda: status()["backends"][0]["index"]["mode"] == "following")
    client = openai.OpenAI(
        base_url=f"{router.url}/v1",
        api_key="unused",
        max_retries=0,
        http_client=httpx.Client(verify=router.verify),
    )
    messages = [
        {"role": "system", "content": "You are Vault, the secrets team's helper. " * 8},
        {"role": "user", "content": "Rotate the key?"},
    ]
    cached = []
    for _ in range(2):
        r = client.chat.completions.create(model="tiny-random", messages=messages, max_tokens=2)  # type: ignore[arg-type]
        assert r.usage is not None and r.usage.prompt_tokens_details is not None
        cached.append(r.usage.prompt_tokens_details.cached_tokens or 0)
    assert cached[1] > 50
    decision = status()["decisions"][0]
    assert decision["predicted_cached_tokens"] == decision["cached_tokens"] == cached[1]


def test_the_status_detail_needs_a_client_certificate(router: Daemon, ca: CertFiles) -> None:
    anonymous = ssl.create_default_context(cafile=str(ca.ca))
    r = httpx.get(f"{router.url}/v1/router/status", headers=AUTH, verify=anonymous)
    assert r.status_code == 403 and r.json()["error"]["code"] == "client_certificate_required"
    summary = httpx.get(f"{router.url}/v1/router/status", verify=anonymous)
    assert summary.status_code == 200 and "backends" in summary.json()  # counts only
    assert httpx.get(f"{router.url}/v1/models", verify=anonymous).status_code == 200


def test_a_daemon_the_router_cannot_verify_is_down_with_the_reason(
    daemon: Daemon, tmp_path: Path
) -> None:
    other = make_local_ca(tmp_path / "other")  # the router trusts another CA
    token = tmp_path / "token"
    token.write_text(TOKEN)
    r = start_router(
        "--backend", daemon.url, "--admin-token-file", str(token),
        "--tls-cert", str(other.cert), "--tls-key", str(other.key), "--tls-ca", str(other.ca),
        ready="/healthz",
    )  # fmt: skip
    try:

        def health() -> str:
            answer = httpx.get(f"{r.url}/v1/router/status", headers=AUTH, verify=r.verify)
            backend = answer.json()["backends"][0]
            return f"{backend['health']} {backend['health_detail']}"

        wait_for(lambda: "certificate" in health().lower())
        assert health().startswith("down")
    finally:
        r.stop()
