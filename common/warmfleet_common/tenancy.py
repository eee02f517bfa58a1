"""Tenants between the router and the daemons, and the cache salt a request's blocks are
keyed with.

The router authenticates a client by its key (`client_keys`) and tells the daemon the
tenant in `x-warmfleet-tenant`, with `x-warmfleet-tenant-signature`: `<expiry>.<hex>`,
HMAC-SHA256 keyed with that daemon's admin token over a fixed label, the tenant and
the expiry (a minute ahead). A daemon honours the header only with a valid signature
(or, with no admin token and no keys file, a loopback daemon open to all anyway); the
router drops any `x-warmfleet-tenant*` header a client sends.

A request's cache salt (`cache_salt`) is its tenant and the `cache_salt` field it may
send itself (vLLM's, for isolation within a tenant): its blocks are keyed in the salt's
own namespace (`chunking`), so no other tenant's request ever hits, or times, them. No
tenant and no field: the empty salt, the shared namespace of an open fleet. Pure
functions: no I/O, no clock unless none is given.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import time

from warmfleet_common.client_keys import TENANT_PATTERN

TENANT_HEADER = "x-warmfleet-tenant"
TENANT_SIGNATURE_HEADER = "x-warmfleet-tenant-signature"
HEADER_PREFIX = "x-warmfleet-tenant"  # every header a client must not send through the router
ASSERTION_S = 60  # what the router gives a request to reach the daemon
_SKEW_S = 60
_SIGNATURE = re.compile(r"^[0-9]{1,12}\.[0-9a-f]{64}$")
_TENANT = re.compile(TENANT_PATTERN)
_LABEL = b"warmfleet-tenant\n"
MAX_CACHE_SALT_CHARS = 256


def _mac(token: str, tenant: str, expiry: int) -> str:
    message = _LABEL + tenant.encode() + b"\n" + str(expiry).encode()
    return hmac.new(token.encode(), message, hashlib.sha256).hexdigest()


def sign_tenant(token: str, tenant: str, *, now: float | None = None) -> str:
    """The signature of `tenant` for the daemon whose admin token is `token`."""
    expiry = int((time.time() if now is None else now) + ASSERTION_S)
    return f"{expiry}.{_mac(token, tenant, expiry)}"


def tenant_refusal(
    token: str, tenant: str, signature: str, *, now: float | None = None
) -> str | None:
    """None when `signature` vouches for `tenant` under `token`; else why not."""
    if _TENANT.fullmatch(tenant) is None:
        return "not a tenant name"
    signature = signature.strip()
    if _SIGNATURE.fullmatch(signature) is None:
        return "malformed signature: <expiry>.<64 hex digits> expected"
    stamp, _, given = signature.partition(".")
    expiry, clock = int(stamp), time.time() if now is None else now
    if expiry <= clock - _SKEW_S:
        return "expired"
    if expiry > clock + ASSERTION_S + _SKEW_S:
        return "expires too far ahead"
    if not hmac.compare_digest(_mac(token, tenant, expiry), given):
        return "not signed for this daemon"
    return None


def cache_salt(tenant: str | None, request_salt: str | None = None) -> bytes:
    """The salt of a request's blocks: b"" (shared) without a tenant or a salt of its own."""
    if not tenant and not request_salt:
        return b""
    return json.dumps([tenant or "", request_salt or ""]).encode()


def cache_salt_problem(value: object) -> str | None:
    """Why a body's `cache_salt` cannot be used (None: it can, or there is none)."""
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        return "cache_salt must be a non-empty string"
    if len(value) > MAX_CACHE_SALT_CHARS:
        return f"cache_salt has more than {MAX_CACHE_SALT_CHARS} characters"
    return None
