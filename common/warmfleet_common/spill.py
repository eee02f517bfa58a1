"""How the router names a peer for a spilled request, and how a daemon checks it.

The router forwards a request away from the daemon that holds its blocks with
`x-warmfleet-peer: <that daemon's URL>` and `x-warmfleet-peer-signature: <HMAC-SHA256
of the URL, keyed with the receiving daemon's admin token>`. A daemon copies from a
peer only when the signature is valid, or the URL is one of its own `--warm-from`
peers: a client cannot make it fetch from an arbitrary URL (the router also drops any
`x-warmfleet-peer*` header a client sends). The signature, not the token, travels with
each request, so a log of forwarded headers does not leak the token.

When the router holds the peer's admin token it also sends a peer grant for it
(`x-warmfleet-peer-grant`, see `grants`): the daemon presents it to the peer instead of
its own token, so nodes with different tokens copy from each other. The signature then
covers the grant too, so a client cannot attach one of its own.
"""

from __future__ import annotations

import hashlib
import hmac
import re

PEER_HEADER = "x-warmfleet-peer"
PEER_SIGNATURE_HEADER = "x-warmfleet-peer-signature"
HEADER_PREFIX = "x-warmfleet-peer"  # every header a client must not send through the router
_URL = re.compile(r"https?://[^\s/?#@]+(/[^\s?#]*)?")


def peer_signature(token: str, url: str, grant: str | None = None) -> str:
    message = b"warmfleet-peer\n" + url.encode()
    if grant is not None:
        message += b"\n" + grant.encode()
    return hmac.new(token.encode(), message, hashlib.sha256).hexdigest()


def signature_valid(token: str, url: str, signature: str, grant: str | None = None) -> bool:
    expected = peer_signature(token, url, grant)
    return hmac.compare_digest(expected.encode(), signature.strip().encode())


def peer_url_valid(url: str) -> bool:
    """An http(s) base URL without credentials, query or fragment."""
    return len(url) <= 2048 and _URL.fullmatch(url) is not None
