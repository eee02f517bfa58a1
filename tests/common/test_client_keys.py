"""The client keys file: `TENANT KEY` lines (keys as they are or hashed), refused with
the line named and never its content, keys compared in constant time, the file read
again when it changes and kept as it was when it no longer parses."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import pytest

from warmfleet_common import client_keys
from warmfleet_common.client_keys import (
    KeyRefused,
    KeysFile,
    KeysFileError,
    check_key,
    hashed_line,
    parse_keys,
    presented_key,
)

KEY = "sk-alpha-0123456789abcdef"


def test_plain_and_hashed_keys_name_their_tenant() -> None:
    other = "sk-beta-0123456789abcdef"
    ring = parse_keys(
        f"# fleet\n\nalpha {KEY}\n{hashed_line('beta', other)}\nalpha sk-alpha-second-key00\n"
    )
    assert ring.tenant_of(KEY) == "alpha"
    assert ring.tenant_of("sk-alpha-second-key00") == "alpha"
    assert ring.tenant_of(other) == "beta"
    assert ring.tenant_of("sk-gamma-0123456789abc") is None
    assert ring.tenants == {"alpha", "beta"}
    digest = hashlib.sha256(other.encode()).hexdigest().upper()  # either case
    assert parse_keys(f"beta sha256:{digest}").tenant_of(other) == "beta"


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "no `TENANT KEY` line"),
        ("alpha\n", "line 1: expected"),
        (f"alpha {KEY} extra\n", "line 1: expected"),
        (f"-alpha {KEY}\n", "line 1: the tenant"),
        ("alpha short\n", "line 1: a key needs"),
        (f"alpha {KEY}\nbeta {KEY}\n", "line 2: this key is already"),
        ("alpha sha256:abc\n", "line 1: a key needs"),
    ],
)
def test_bad_files_are_refused_naming_the_line_never_the_key(text: str, why: str) -> None:
    with pytest.raises(KeysFileError) as refused:
        parse_keys(text)
    assert why in str(refused.value)
    assert KEY not in str(refused.value) and "short" not in str(refused.value)


def test_each_api_presents_its_key_in_its_own_header() -> None:
    ring = parse_keys(f"alpha {KEY}")
    bearer = {"authorization": f"Bearer {KEY}"}
    assert check_key(ring, bearer, anthropic=False) == "alpha"
    assert check_key(ring, bearer, anthropic=True) == "alpha"  # ANTHROPIC_AUTH_TOKEN
    assert check_key(ring, {"x-api-key": KEY}, anthropic=True) == "alpha"
    # An OpenAI route takes no x-api-key.
    assert check_key(ring, {"x-api-key": KEY}, anthropic=False) == KeyRefused(
        "missing_api_key", "a client API key is required: send Authorization: Bearer KEY"
    )
    refused = check_key(ring, {"authorization": "Bearer sk-nope"}, anthropic=False)
    assert isinstance(refused, KeyRefused) and refused.code == "invalid_api_key"
    assert presented_key({"authorization": "Basic abc"}, anthropic=False) is None


def test_the_file_is_read_again_when_it_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(client_keys, "RELOAD_CHECK_S", 0.0)
    path = tmp_path / "keys"
    path.write_text(f"alpha {KEY}\n")
    keys = KeysFile(str(path))
    assert keys.current().tenant_of(KEY) == "alpha"
    path.write_text(f"beta {KEY}\n")
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 10**9))
    assert keys.current().tenant_of(KEY) == "beta" and keys.reloads == 1
    path.write_text("broken\n")
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 2 * 10**9))
    assert keys.current().tenant_of(KEY) == "beta"  # the keys read before stay
    path.unlink()
    assert keys.current().tenant_of(KEY) == "beta"
    with pytest.raises(OSError):
        KeysFile(str(path))
