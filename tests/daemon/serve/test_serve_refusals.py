"""`warmfleet serve` refuses to start half-alive or open: a --state-dir (or its
kv-blocks directory) that cannot be created, an empty --admin-token-file or
WARMFLEET_ADMIN_TOKEN, a port already taken. It exits non-zero with the reason instead
of serving 503s (or open admin routes) forever."""

from __future__ import annotations

import socket
from pathlib import Path

from support.processes import serve_refusal


def test_a_state_dir_that_cannot_be_created(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    done = serve_refusal("--state-dir", str(blocker / "state"))
    assert done.returncode == 2
    assert "state" in done.stderr and "Not a directory" in done.stderr


def test_a_kv_blocks_path_that_is_not_a_directory(tmp_path: Path) -> None:
    (tmp_path / "kv-blocks").write_text("not a directory")  # where KV snapshots go
    done = serve_refusal("--state-dir", str(tmp_path))
    assert done.returncode == 2
    assert f"{tmp_path / 'kv-blocks'} is not a directory" in done.stderr
    assert "--snapshot-disk-mb 0" in done.stderr


def test_an_empty_admin_token_file(tmp_path: Path) -> None:
    empty = tmp_path / "token"
    empty.write_text("\n")
    done = serve_refusal("--admin-token-file", str(empty))
    assert done.returncode == 2 and "is empty" in done.stderr


def test_an_empty_admin_token_variable() -> None:
    done = serve_refusal(env={"WARMFLEET_ADMIN_TOKEN": " "})
    assert done.returncode == 2 and "WARMFLEET_ADMIN_TOKEN is empty" in done.stderr


def test_a_port_already_taken() -> None:
    # Refused before the model loads (uvicorn's own late bind aborted a loading process).
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        done = serve_refusal("--port", str(port))
    assert done.returncode == 3
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr
    assert "Address already in use" in done.stderr
    assert "loading model" not in done.stderr
