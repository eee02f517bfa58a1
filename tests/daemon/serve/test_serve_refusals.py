"""`warmfleet serve` refuses to start half-alive or open: a --state-dir (or its
kv-blocks directory) that cannot be created, an empty --admin-token-file or
WARMFLEET_ADMIN_TOKEN, a port already taken. It exits non-zero with the reason instead
of serving 503s (or open admin routes) forever."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from support.processes import free_port


def serve(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "warmfleet_cli", "serve", "--model", "tiny-random"]
    cmd += ["--port", str(free_port()), *args]
    environ = {k: v for k, v in os.environ.items() if k != "WARMFLEET_ADMIN_TOKEN"}
    try:
        return subprocess.run(
            cmd, env={**environ, **(env or {})}, capture_output=True, text=True, timeout=60
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"`{' '.join(cmd)}` kept running instead of refusing to start")


def test_a_state_dir_that_cannot_be_created(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    done = serve("--state-dir", str(blocker / "state"))
    assert done.returncode == 2
    assert "state" in done.stderr and "Not a directory" in done.stderr


def test_a_kv_blocks_path_that_is_not_a_directory(tmp_path: Path) -> None:
    (tmp_path / "kv-blocks").write_text("not a directory")  # where KV snapshots go
    done = serve("--state-dir", str(tmp_path))
    assert done.returncode == 2
    assert f"{tmp_path / 'kv-blocks'} is not a directory" in done.stderr
    assert "--snapshot-disk-mb 0" in done.stderr


def test_an_empty_admin_token_file(tmp_path: Path) -> None:
    empty = tmp_path / "token"
    empty.write_text("\n")
    done = serve("--admin-token-file", str(empty))
    assert done.returncode == 2 and "is empty" in done.stderr


def test_an_empty_admin_token_variable() -> None:
    done = serve(env={"WARMFLEET_ADMIN_TOKEN": " "})
    assert done.returncode == 2 and "WARMFLEET_ADMIN_TOKEN is empty" in done.stderr


def test_a_port_already_taken() -> None:
    # Refused before the model loads (uvicorn's own late bind aborted a loading process).
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        done = serve("--port", str(port))
    assert done.returncode == 3
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr
    assert "Address already in use" in done.stderr
    assert "loading model" not in done.stderr
