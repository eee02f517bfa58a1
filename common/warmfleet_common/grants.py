"""Peer grants: how one daemon reads another's warm blocks when the two hold different
admin tokens.

Whoever names a peer (the operator in a warm push, the router in a spill or a drain
handoff) holds that peer's admin token and issues a grant: `<expiry>.<hex>`, the expiry
in Unix seconds and HMAC-SHA256, keyed with the peer's admin token, of a fixed label,
the peer's URL and the expiry. The receiving daemon presents it to the peer
(`x-warmfleet-peer-grant`) instead of its own token; the peer honours it only on its
read-only peer routes (`GET /v1/cache/fingerprint`, `GET /v1/cache/blocks`), only for
the URL it was reached at (its `Host`), only before the expiry and never for an expiry
more than `MAX_GRANT_S` ahead. Pure functions: no I/O, no clock unless none is given.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import time
from collections.abc import Iterable
from urllib.parse import urlsplit

GRANT_HEADER = "x-warmfleet-peer-grant"
DEFAULT_GRANT_S = 600  # what an issuer gives: a warm-up's or a drain's copy fits in it
MAX_GRANT_S = 900  # a peer refuses a grant that expires later than this from now
_SKEW_S = 60  # clocks of issuer and peer may differ by this much
GRANT_PATTERN = r"^[0-9]{1,12}\.[0-9a-f]{64}$"
_GRANT = re.compile(GRANT_PATTERN)
_LABEL = b"warmfleet-peer-grant\n"
_DEFAULT_PORTS = {"http": 80, "https": 443}


def grant_url(url: str) -> str:
    """`url` as a grant names it: scheme and host lowercased, a default port and a
    trailing slash dropped (what `http://Mac1:80/` and `http://mac1` both mean)."""
    parts = urlsplit(url.strip())
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").lower()
    if ":" in host:  # an IPv6 literal keeps its brackets
        host = f"[{host}]"
    try:
        port = parts.port
    except ValueError:
        port = None
    netloc = host if port is None or port == _DEFAULT_PORTS.get(scheme) else f"{host}:{port}"
    return f"{scheme}://{netloc}{parts.path.rstrip('/')}"


def _mac(token: str, url: str, expiry: int) -> str:
    message = _LABEL + grant_url(url).encode() + b"\n" + str(expiry).encode()
    return hmac.new(token.encode(), message, hashlib.sha256).hexdigest()


def issue_grant(
    token: str, url: str, *, ttl_s: float = DEFAULT_GRANT_S, now: float | None = None
) -> str:
    """A grant to read the blocks of the daemon at `url` (whose admin token is
    `token`) until `ttl_s` from `now`."""
    expiry = int((time.time() if now is None else now) + min(ttl_s, MAX_GRANT_S))
    return f"{expiry}.{_mac(token, url, expiry)}"


def grant_refusal(
    token: str, urls: Iterable[str], grant: str, *, now: float | None = None
) -> str | None:
    """None when `grant` is valid for one of `urls` (the ways this daemon was reached)
    under `token`; else why not, for the 401's message."""
    grant = grant.strip()
    if _GRANT.fullmatch(grant) is None:
        return "malformed: <expiry>.<64 hex digits> expected"
    stamp, _, given = grant.partition(".")
    expiry = int(stamp)
    clock = time.time() if now is None else now
    if expiry <= clock:
        return "expired"
    if expiry > clock + MAX_GRANT_S + _SKEW_S:
        return f"expires more than {MAX_GRANT_S}s ahead"
    # Every candidate is checked, so the time taken does not say which URL was close.
    valid = [hmac.compare_digest(_mac(token, url, expiry), given) for url in urls]
    return None if any(valid) else "not signed for this daemon"


def urls_reached_at(host: str, root_path: str = "") -> list[str]:
    """The URLs a request with this `Host` header was addressed to (the scheme is not
    known behind a TLS-terminating proxy: both)."""
    host = host.strip()
    if not host or any(c in host for c in "/?#@ \t"):
        return []
    return [grant_url(f"{scheme}://{host}{root_path}") for scheme in ("http", "https")]
