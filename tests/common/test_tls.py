"""TLS contexts, the certificate reload and the client-certificate flag, as plain
Python over real certificates from a throwaway CA."""

from __future__ import annotations

import ssl
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from warmfleet_cli.local_ca import CertFiles, issue_from, make_local_ca
from warmfleet_common.tls import (
    PEER_VERIFIED,
    CertReloader,
    TlsOptions,
    client_context,
    peer_verified,
    server_context,
    with_peer_certificate,
)


@pytest.fixture
def ca(tmp_path: Path) -> CertFiles:
    return make_local_ca(tmp_path / "ca")


def test_contexts_speak_tls_1_2_and_up_and_verify(ca: CertFiles) -> None:
    options = TlsOptions(str(ca.cert), str(ca.key), str(ca.ca), str(ca.ca))
    server = server_context(options)
    assert server.minimum_version == ssl.TLSVersion.TLSv1_2
    assert server.verify_mode == ssl.CERT_OPTIONAL  # asked of all; routes decide
    assert server_context(TlsOptions(str(ca.cert), str(ca.key))).verify_mode == ssl.CERT_NONE
    client = client_context(options)
    assert client.minimum_version == ssl.TLSVersion.TLSv1_2
    assert client.verify_mode == ssl.CERT_REQUIRED and client.check_hostname


def test_problems_name_the_flag(ca: CertFiles, tmp_path: Path) -> None:
    assert TlsOptions(str(ca.cert), str(ca.key), str(ca.ca)).problem() is None
    assert "go together" in str(TlsOptions(cert=str(ca.cert)).problem())
    assert "--tls-client-ca needs" in str(TlsOptions(client_ca=str(ca.ca)).problem())
    missing = str(tmp_path / "nope.crt")
    assert f"--tls-ca {missing}" in str(TlsOptions(ca=missing).problem())
    swapped = TlsOptions(str(ca.key), str(ca.cert))
    assert "do not load" in str(swapped.problem())


def test_the_reloader_loads_a_renewed_pair_and_keeps_the_old_on_a_bad_one(
    ca: CertFiles, tmp_path: Path
) -> None:
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert.write_bytes(ca.cert.read_bytes())
    key.write_bytes(ca.key.read_bytes())
    context = server_context(TlsOptions(str(cert), str(key)))
    reloader = CertReloader(str(cert), str(key), [context])
    assert not reloader.check()  # nothing changed
    renewed = issue_from(ca.ca, tmp_path / "renewed", ["localhost"])
    cert.write_bytes(renewed.cert.read_bytes())  # half a rotation: a new cert, the old key
    assert not reloader.check() and reloader.reloads == 0
    key.write_bytes(renewed.key.read_bytes())
    assert reloader.check() and reloader.reloads == 1


def test_requests_say_whether_their_connection_had_a_verified_certificate() -> None:
    class Base:
        def __init__(self) -> None:
            self.app_state: dict[str, Any] = {"shared": 1}

        def connection_made(self, transport: Any) -> None:
            self.transport = transport

    protocol = with_peer_certificate(Base)

    def connect(cert: dict[str, Any] | None) -> Any:
        ssl_object = None if cert is None else SimpleNamespace(getpeercert=lambda: cert)
        transport = SimpleNamespace(get_extra_info=lambda name: ssl_object)
        made = protocol()
        made.connection_made(transport)
        return made

    shared = Base()
    with_cert = connect({"subject": ()})
    assert with_cert.app_state == {"shared": 1, PEER_VERIFIED: True}
    assert connect({}).app_state[PEER_VERIFIED] is False  # none presented
    assert connect(None).app_state[PEER_VERIFIED] is False  # plain HTTP
    assert shared.app_state == {"shared": 1}  # per connection, never the server's own
    assert peer_verified({"state": with_cert.app_state})
    assert not peer_verified({"state": {}}) and not peer_verified({})
