"""The router's signed tenant and a request's cache salt."""

from __future__ import annotations

from warmfleet_common.tenancy import (
    cache_salt,
    cache_salt_problem,
    sign_tenant,
    tenant_refusal,
)

TOKEN = "admin-token-of-node-1"
NOW = 1_800_000_000.0


def test_a_signed_tenant_is_honoured_only_as_signed_and_in_time() -> None:
    signature = sign_tenant(TOKEN, "alpha", now=NOW)
    assert tenant_refusal(TOKEN, "alpha", signature, now=NOW) is None
    assert tenant_refusal(TOKEN, "beta", signature, now=NOW) == "not signed for this daemon"
    assert tenant_refusal("another-token", "alpha", signature, now=NOW) is not None
    assert tenant_refusal(TOKEN, "alpha", signature, now=NOW + 600) == "expired"
    assert tenant_refusal(TOKEN, "alpha", signature, now=NOW - 600) == "expires too far ahead"
    assert tenant_refusal(TOKEN, "alpha", "123.abc", now=NOW) is not None
    assert tenant_refusal(TOKEN, "bad tenant", signature, now=NOW) == "not a tenant name"


def test_cache_salts() -> None:
    assert cache_salt(None) == cache_salt(None, None) == b""
    salts = {cache_salt("a"), cache_salt("b"), cache_salt("a", "x"), cache_salt(None, "x")}
    assert len(salts) == 4 and b"" not in salts
    # No tenant name and salt run together into another's.
    assert cache_salt("a", "bx") != cache_salt("ab", "x")
    assert cache_salt_problem(None) is None and cache_salt_problem("x") is None
    assert cache_salt_problem("") and cache_salt_problem(3) and cache_salt_problem("x" * 300)
