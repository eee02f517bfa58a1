"""`warmfleet serve --tls-cert --tls-key` over real HTTPS (a throwaway CA from
`warmfleet_cli.local_ca`): the official `openai` client verifies it with the CA, a client
without the CA or speaking plain HTTP gets nothing, TLS older than 1.2 is refused, a
certificate rotated under the running daemon is served without a restart, and with
`--tls-client-ca` the admin routes need a client certificate (mTLS) while inference
routes do not; plain HTTP beyond loopback says so in the log."""

from __future__ import annotations

import json
import socket
import ssl
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from support.processes import Daemon, serve_refusal, start_daemon
from warmfleet_cli.local_ca import CertFiles, issue_from, make_local_ca

TOKEN = "tls-admin-token-0123"


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> CertFiles:
    return make_local_ca(tmp_path_factory.mktemp("ca"))


@pytest.fixture(scope="module")
def daemon(ca: CertFiles) -> Iterator[Daemon]:
    d = start_daemon(
        "--model", "tiny-random", "--tls-cert", str(ca.cert), "--tls-key", str(ca.key),
        "--tls-ca", str(ca.ca), "--tls-client-ca", str(ca.ca),
        env={"WARMFLEET_ADMIN_TOKEN": TOKEN},
    )  # fmt: skip
    yield d
    d.stop()


def served_certificate(url: str, ca: CertFiles) -> tuple[bytes, str]:
    """The certificate the daemon serves now (DER) and the TLS version negotiated."""
    host, port = url.removeprefix("https://").split(":")
    context = ssl.create_default_context(cafile=str(ca.ca))
    with (
        socket.create_connection((host, int(port)), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname=host) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
        assert der is not None
        return der, str(tls.version())


def test_clients_verify_the_daemon_with_the_ca(daemon: Daemon, ca: CertFiles) -> None:
    assert daemon.url.startswith("https://")
    http = httpx.Client(verify=ssl.create_default_context(cafile=str(ca.ca)))
    client = openai.OpenAI(
        base_url=f"{daemon.url}/v1", api_key="unused", max_retries=0, http_client=http
    )
    r = client.chat.completions.create(
        model="tiny-random",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=2,
    )
    assert r.choices[0].message.role == "assistant"
    with pytest.raises(httpx.ConnectError):  # the system's CAs do not know the local one
        httpx.get(f"{daemon.url}/healthz")
    plain = daemon.url.replace("https://", "http://")
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{plain}/healthz")


def test_tls_older_than_1_2_is_refused(daemon: Daemon, ca: CertFiles) -> None:
    _, version = served_certificate(daemon.url, ca)
    assert version in ("TLSv1.2", "TLSv1.3")
    old = ssl.create_default_context(cafile=str(ca.ca))
    with warnings.catch_warnings():  # TLS 1.1 is deprecated: that is the point
        warnings.simplefilter("ignore", DeprecationWarning)
        old.minimum_version = ssl.TLSVersion.MINIMUM_SUPPORTED
        old.maximum_version = ssl.TLSVersion.TLSv1_1
    with pytest.raises((ssl.SSLError, httpx.ConnectError)):
        httpx.get(f"{daemon.url}/healthz", verify=old)


def test_admin_routes_need_a_client_certificate(daemon: Daemon, ca: CertFiles) -> None:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    anonymous = ssl.create_default_context(cafile=str(ca.ca))
    r = httpx.get(f"{daemon.url}/v1/warm-sets", headers=auth, verify=anonymous)
    assert r.status_code == 403 and r.json()["error"]["code"] == "client_certificate_required"
    # Inference and health stay open to clients without one.
    assert httpx.get(f"{daemon.url}/v1/models", verify=anonymous).status_code == 200
    assert httpx.get(f"{daemon.url}/v1/status", verify=anonymous).status_code == 200
    mutual = ssl.create_default_context(cafile=str(ca.ca))
    mutual.load_cert_chain(str(ca.cert), str(ca.key))
    assert httpx.get(f"{daemon.url}/v1/warm-sets", headers=auth, verify=mutual).status_code == 200
    r = httpx.get(f"{daemon.url}/v1/warm-sets", verify=mutual)  # a certificate is no token
    assert r.status_code == 401


def test_a_rotated_certificate_is_served_without_a_restart(ca: CertFiles, tmp_path: Path) -> None:
    own = CertFiles(tmp_path / "tls.crt", tmp_path / "tls.key", ca.ca)
    own.cert.write_bytes(ca.cert.read_bytes())
    own.key.write_bytes(ca.key.read_bytes())
    d = start_daemon(
        "--model", "tiny-random", "--tls-cert", str(own.cert), "--tls-key", str(own.key),
        "--tls-ca", str(ca.ca),
    )  # fmt: skip
    try:
        before, _ = served_certificate(d.url, ca)
        # cert-manager renews: a new key and certificate from the same CA, swapped in.
        fresh = issue_from(ca.ca, tmp_path / "new", ["localhost", "127.0.0.1"])
        fresh.key.replace(own.key)
        fresh.cert.replace(own.cert)
        deadline = time.monotonic() + 20
        while served_certificate(d.url, ca)[0] == before:
            assert time.monotonic() < deadline, "the new certificate was never served"
            time.sleep(0.5)
        assert httpx.get(f"{d.url}/healthz", verify=d.verify).status_code == 200
    finally:
        d.stop()


def test_a_half_given_tls_setup_is_refused(ca: CertFiles) -> None:
    done = serve_refusal("--tls-cert", str(ca.cert))
    assert done.returncode == 2 and "--tls-cert and --tls-key go together" in done.stderr
    done = serve_refusal("--tls-cert", str(ca.cert), "--tls-key", str(ca.ca))
    assert done.returncode == 2 and "do not load" in done.stderr


def test_a_peer_copies_warm_blocks_over_mutual_tls(ca: CertFiles, tmp_path: Path) -> None:
    """Two daemons requiring client certificates on their peer routes: one copies the
    other's warm blocks over HTTPS, presenting its own certificate, and computes none."""
    system = {"role": "system", "content": "You are Relay, the on-call handover assistant. " * 14}
    prompts = tmp_path / "agents.json"
    prompts.write_text(json.dumps([{"name": "relay", "messages": [system]}]))
    common = (
        "--model", "tiny-random", "--block-size", "32", "--warm-prompts", str(prompts),
        "--tls-cert", str(ca.cert), "--tls-key", str(ca.key), "--tls-ca", str(ca.ca),
        "--tls-client-ca", str(ca.ca),
    )  # fmt: skip
    env = {"WARMFLEET_ADMIN_TOKEN": TOKEN}
    auth = {"Authorization": f"Bearer {TOKEN}"}
    mutual = ssl.create_default_context(cafile=str(ca.ca))
    mutual.load_cert_chain(str(ca.cert), str(ca.key))
    first = start_daemon(*common, env=env)
    try:
        wait_warm_tls(first, mutual)
        copy = start_daemon(*common, "--warm-from", first.url, env=env)
        try:
            wait_warm_tls(copy, mutual)
            held = httpx.get(
                f"{copy.url}/v1/warm-sets/local/warm-prompts", headers=auth, verify=mutual
            ).json()
            assert held["prompts"][0]["computed_tokens"] == 0  # copied, not prefilled
        finally:
            copy.stop()
    finally:
        first.stop()


def wait_warm_tls(daemon: Daemon, verify: ssl.SSLContext) -> None:
    deadline = time.monotonic() + 120
    while httpx.get(f"{daemon.url}/readyz", params={"warm": 1}, verify=verify).status_code != 200:
        assert time.monotonic() < deadline, daemon.log()
        time.sleep(0.2)
