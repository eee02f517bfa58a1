"""Client API keys and the tenants they name: `--api-keys-file FILE` on the router and
the daemons.

The file has one `TENANT KEY` pair a line (`#` comments and blank lines are skipped);
the key is written as it is, or as `sha256:<64 hex digits>` (its SHA-256) to keep it
hashed at rest. A tenant may have several keys (rotation); a key names one tenant.
Clients send their key in their API's own header: `Authorization: Bearer KEY` (OpenAI
clients, Codex) or `x-api-key: KEY` (Anthropic clients: Claude Code's
`ANTHROPIC_API_KEY`; its `ANTHROPIC_AUTH_TOKEN` arrives as a Bearer token, also taken on
Anthropic's routes). A key given is hashed and compared with every key held in constant
time; no key, and no line of the file, is ever logged or echoed in an error.

`KeysFile` reads the file again when it changes, at most once a second (`watched`); a
file that no longer parses keeps the keys read before. Plain Python, no I/O but reading
that file.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Mapping
from dataclasses import dataclass

from warmfleet_common.watched import WatchedFile

TENANT_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"
_TENANT = re.compile(TENANT_PATTERN)
_HASHED = re.compile(r"^sha256:([0-9a-fA-F]{64})$")
MIN_KEY_CHARS = 16
RELOAD_CHECK_S = 1.0
# The header each API's clients send their key in (besides `Authorization: Bearer`).
API_KEY_HEADER = "x-api-key"


class KeysFileError(ValueError):
    """The keys file cannot be used; the message names the line, never its content."""


@dataclass(frozen=True)
class KeyRing:
    """SHA-256 digests of the keys, each with its tenant."""

    entries: tuple[tuple[bytes, str], ...]

    @property
    def tenants(self) -> frozenset[str]:
        return frozenset(tenant for _, tenant in self.entries)

    def tenant_of(self, key: str) -> str | None:
        """The tenant `key` belongs to, or None. Every entry is compared (in constant
        time each), so the time taken says nothing of which one matched, or how close."""
        digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()
        found: str | None = None
        for held, tenant in self.entries:
            if hmac.compare_digest(held, digest) and found is None:
                found = tenant
        return found


def parse_keys(text: str) -> KeyRing:
    """A keys file's content; KeysFileError naming the first bad line."""
    entries: list[tuple[bytes, str]] = []
    owners: dict[bytes, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) != 2:
            raise KeysFileError(f"line {number}: expected `TENANT KEY`")
        tenant, key = parts
        if not _TENANT.fullmatch(tenant):
            raise KeysFileError(
                f"line {number}: the tenant must match {TENANT_PATTERN} (letters, digits, "
                "'.', '_', '-'; at most 63)"
            )
        hashed = _HASHED.fullmatch(key)
        if hashed is not None:
            digest = bytes.fromhex(hashed.group(1))
        elif len(key) < MIN_KEY_CHARS:
            raise KeysFileError(
                f"line {number}: a key needs at least {MIN_KEY_CHARS} characters (or write "
                "it as sha256:HEX)"
            )
        else:
            digest = hashlib.sha256(key.encode()).digest()
        owner = owners.setdefault(digest, tenant)
        if owner != tenant:
            raise KeysFileError(f"line {number}: this key is already the key of another tenant")
        entries.append((digest, tenant))
    if not entries:
        raise KeysFileError("no `TENANT KEY` line: every request would be refused")
    return KeyRing(tuple(entries))


def hashed_line(tenant: str, key: str) -> str:
    """A keys file line with `key` kept as its hash (what `sha256:HEX` means)."""
    return f"{tenant} sha256:{hashlib.sha256(key.encode()).hexdigest()}"


class KeysFile(WatchedFile[KeyRing]):
    """The keys of a file, read again when it changes (`watched`)."""

    def __init__(self, path: str) -> None:
        super().__init__(
            path,
            parse_keys,
            "client keys",
            check_s=RELOAD_CHECK_S,
            describe=lambda r: f": {len(r.entries)} keys of {len(r.tenants)} tenants",
        )


def presented_key(headers: Mapping[str, str], *, anthropic: bool) -> str | None:
    """The key a request presents in its API's header (`headers` lowercased): an
    Anthropic route takes `x-api-key` or a Bearer token, the others a Bearer token."""
    if anthropic:
        given = headers.get(API_KEY_HEADER, "").strip()
        if given:
            return given
    scheme, _, token = headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return None


@dataclass(frozen=True)
class KeyRefused:
    """Why a request's key is refused (a 401): `missing_api_key` or `invalid_api_key`."""

    code: str
    message: str


def check_key(ring: KeyRing, headers: Mapping[str, str], *, anthropic: bool) -> str | KeyRefused:
    """The tenant of the key a request presents (`headers` lowercased), or why not."""
    given = presented_key(headers, anthropic=anthropic)
    if given is None:
        where = "x-api-key: KEY (or Authorization: Bearer KEY)" if anthropic else "Bearer KEY"
        header = "" if anthropic else "Authorization: "
        return KeyRefused("missing_api_key", f"a client API key is required: send {header}{where}")
    tenant = ring.tenant_of(given)
    if tenant is None:
        return KeyRefused("invalid_api_key", "the API key is not valid")
    return tenant


# Routes that serve no inference but show data (metrics name tenants and their usage,
# status names warm sets, the API document the routes): with a keys file they need a key
# too; only the liveness and readiness probes stay open.
SHOWS_DATA = frozenset({"/metrics", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"})


def reader_refusal(
    ring: KeyRing, headers: Mapping[str, str], admin_token: str | None
) -> KeyRefused | None:
    """None when a request to a route that shows data presents the admin token or any
    client key (in either header); else why it is refused (a 401)."""
    given = presented_key(headers, anthropic=True)
    if given and admin_token and hmac.compare_digest(_utf8(given), _utf8(admin_token)):
        return None
    checked = check_key(ring, headers, anthropic=True)
    return checked if isinstance(checked, KeyRefused) else None


def is_client_key(ring: KeyRing | None, headers: Mapping[str, str]) -> bool:
    """Whether the request presents a valid client key (so its Bearer token is not an
    admin token to check)."""
    return ring is not None and isinstance(check_key(ring, headers, anthropic=True), str)


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")
