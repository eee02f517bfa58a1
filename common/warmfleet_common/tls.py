"""TLS for every hop: the contexts the daemons and the router serve HTTPS with, the ones
every client the project ships verifies them with, and the reload of certificates that
cert-manager (or anyone) rotates under a running process.

Files follow cert-manager's Secret layout: `tls.crt` (the certificate, chain after it),
`tls.key` (its key), `ca.crt` (the CA that signed it, which clients verify with). TLS
1.2 is the oldest version either side speaks. A server given a client CA asks every
client for a certificate (optional at the handshake: inference clients have none) and
tells the routes whether one was verified (`with_peer_certificate`), so the admin,
warm-set and peer routes can require one (mTLS); a client presents its client
certificate when it has one (`client_cert`, by default the component's own `cert`: then
issue that for both server and client auth).

`CertReloader` looks at the files every few seconds and loads them again into the same
contexts when they change, so new connections get the new certificate and open ones
carry on; a pair that does not load (a rotation caught half-written) keeps the one
before and is tried again at the next look. Plain Python and the standard `ssl`.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

MINIMUM_VERSION = ssl.TLSVersion.TLSv1_2
RELOAD_CHECK_S = 5.0
# The per-connection state key (ASGI `scope["state"]`) saying a client certificate was
# presented and verified against the server's client CA.
PEER_VERIFIED = "warmfleet.tls.peer_verified"


@dataclass(frozen=True)
class TlsOptions:
    """A component's TLS files (None: that part is off)."""

    cert: str | None = None  # served (and presented as a client's, without client_cert)
    key: str | None = None
    ca: str | None = None  # verifies the servers it calls (else the system's CAs)
    client_ca: str | None = None  # verifies client certificates (mTLS on protected routes)
    client_cert: str | None = None  # presented to servers that ask for a client certificate
    client_key: str | None = None

    @property
    def serves(self) -> bool:
        return self.cert is not None

    @property
    def presented(self) -> tuple[str, str] | None:
        """The client certificate and key presented, if any."""
        if self.client_cert is not None and self.client_key is not None:
            return self.client_cert, self.client_key
        if self.cert is not None and self.key is not None:
            return self.cert, self.key
        return None

    def problem(self) -> str | None:
        """Why these cannot be used (a flag missing, a file unreadable), or None."""
        if (self.cert is None) != (self.key is None):
            return "--tls-cert and --tls-key go together"
        if (self.client_cert is None) != (self.client_key is None):
            return "--tls-client-cert and --tls-client-key go together"
        if self.client_ca is not None and self.cert is None:
            return "--tls-client-ca needs --tls-cert and --tls-key (it is checked over HTTPS)"
        for flag, path in (
            ("--tls-cert", self.cert),
            ("--tls-key", self.key),
            ("--tls-ca", self.ca),
            ("--tls-client-ca", self.client_ca),
            ("--tls-client-cert", self.client_cert),
            ("--tls-client-key", self.client_key),
        ):
            if path is not None and not os.access(path, os.R_OK):
                return f"{flag} {path}: not a readable file"
        try:
            if self.cert is not None:
                server_context(self)
            client_context(self)
        except (ssl.SSLError, OSError, ValueError) as exc:
            return f"the TLS files do not load: {exc}"
        return None


def server_context(options: TlsOptions) -> ssl.SSLContext:
    """What a daemon or the router serves HTTPS with."""
    assert options.cert is not None and options.key is not None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = MINIMUM_VERSION
    ctx.load_cert_chain(options.cert, options.key)
    if options.client_ca is not None:
        ctx.verify_mode = ssl.CERT_OPTIONAL  # asked of all, required by the routes that need it
        ctx.load_verify_locations(options.client_ca)
    return ctx


def client_context(options: TlsOptions) -> ssl.SSLContext:
    """What a component verifies the servers it calls with (`ca`, else the system's), and
    presents as its certificate (`presented`) when a server asks for one."""
    ctx = ssl.create_default_context(cafile=options.ca)
    ctx.minimum_version = MINIMUM_VERSION
    if options.presented is not None:
        ctx.load_cert_chain(*options.presented)
    return ctx


def client_verify(options: TlsOptions) -> ssl.SSLContext | bool:
    """What an httpx client verifies servers with: `client_context` when a CA or a
    certificate is given (the certificate then reloaded as it rotates), else True (the
    system's CAs, for https URLs)."""
    if options.ca is None and options.presented is None:
        return True
    context = client_context(options)
    if options.presented is not None:
        CertReloader(*options.presented, [context]).start()
    return context


class CertReloader:
    """Loads `cert` and `key` again into `contexts` whenever the files change."""

    def __init__(
        self,
        cert: str,
        key: str,
        contexts: Sequence[ssl.SSLContext],
        *,
        check_s: float = RELOAD_CHECK_S,
    ) -> None:
        self.cert, self.key = cert, key
        self.contexts = list(contexts)
        self.check_s = check_s
        self.reloads = 0
        self._stamp = self._stamps()
        self._failed: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> CertReloader:
        self._thread = threading.Thread(target=self._run, name="warmfleet-tls-reload", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def check(self) -> bool:
        """Reload if the files changed; True when it did."""
        try:
            stamp = self._stamps()
        except OSError as exc:
            self._fail(f"cannot be read ({exc}); the certificate loaded before stays")
            return False
        if stamp == self._stamp:
            return False
        try:
            for ctx in self.contexts:
                ctx.load_cert_chain(self.cert, self.key)
        except (ssl.SSLError, OSError, ValueError) as exc:
            self._fail(f"do not load ({exc}); the certificate loaded before stays")
            return False
        self._stamp, self._failed = stamp, None
        self.reloads += 1
        log.info("TLS certificate %s loaded again (it changed)", self.cert)
        return True

    def _run(self) -> None:
        while not self._stop.wait(self.check_s):
            self.check()

    def _fail(self, why: str) -> None:
        if why != self._failed:
            log.error("TLS files %s, %s %s", self.cert, self.key, why)
            self._failed = why

    def _stamps(self) -> tuple[tuple[int, int, int], ...]:
        out = []
        for path in (self.cert, self.key):
            st = os.stat(path)
            out.append((st.st_ino, st.st_size, st.st_mtime_ns))
        return tuple(out)


def with_peer_certificate(base: type[Any]) -> type[Any]:
    """An HTTP protocol class (uvicorn's) whose requests say in their ASGI state whether
    the connection presented a verified client certificate (`PEER_VERIFIED`)."""

    class PeerCertificateProtocol(base):  # type: ignore[misc]
        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            ssl_object = transport.get_extra_info("ssl_object")
            verified = bool(ssl_object is not None and ssl_object.getpeercert())
            # Copied into each request's scope["state"]; per connection, not per server.
            state: dict[str, Any] = getattr(self, "app_state", {})
            self.app_state = {**state, PEER_VERIFIED: verified}

    PeerCertificateProtocol.__name__ = f"PeerCertificate{base.__name__}"
    return PeerCertificateProtocol


def install_https(config: Any, options: TlsOptions) -> CertReloader:
    """Serve `config` (a uvicorn Config, not loaded yet) over HTTPS with `options`' files:
    this module's context (TLS 1.2 and up, client certificates checked), the requests
    told whether theirs was verified; returns the reloader of the certificate (started)."""
    assert options.cert is not None and options.key is not None
    config.ssl_certfile, config.ssl_keyfile = options.cert, options.key  # says https
    config.load()
    context = server_context(options)
    config.ssl = context
    config.http_protocol_class = with_peer_certificate(config.http_protocol_class)
    return CertReloader(options.cert, options.key, [context]).start()


def peer_verified(scope: Any) -> bool:
    """Whether the request's connection presented a verified client certificate."""
    state = scope.get("state") if isinstance(scope, dict) else None
    return bool(state and state.get(PEER_VERIFIED))


def listens_beyond_loopback(host: str) -> bool:
    return not (host in ("localhost", "::1") or host.startswith("127."))
