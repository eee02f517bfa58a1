"""Real processes for tests: `warmfleet serve` and `warmfleet router` in subprocesses on
127.0.0.1, and an app served in process by a real uvicorn."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import httpx
import uvicorn
from fastapi import FastAPI


@dataclass
class Daemon:
    url: str
    process: subprocess.Popen[bytes]
    log_path: str

    def log(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_daemon(
    *args: str, timeout: float = 180, env: dict[str, str] | None = None, port: int | None = None
) -> Daemon:
    """`warmfleet serve ARGS` on a free port, once its /readyz says the model is loaded."""
    return _start("serve", args, timeout=timeout, env=env, port=port)


def start_router(*args: str, timeout: float = 60, port: int | None = None) -> Daemon:
    """`warmfleet router ARGS` on a free port, once its /readyz says a backend is ready."""
    return _start("router", args, timeout=timeout, env=None, port=port)


@contextmanager
def serving(app: FastAPI) -> Iterator[str]:
    """`app` served by a real uvicorn on a free port, in a thread of the test process:
    real HTTP (keep-alive, streaming, concurrency) with an engine the test holds."""
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    )
    thread = threading.Thread(target=server.run, name="test-uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def _start(
    command: str,
    args: tuple[str, ...],
    *,
    timeout: float,
    env: dict[str, str] | None,
    port: int | None,
) -> Daemon:
    port = port or free_port()
    cmd = [sys.executable, "-m", "warmfleet_cli", command, "--port", str(port), *args]
    if "--log-level" not in args:
        cmd += ["--log-level", "warning"]
    fd, log_path = tempfile.mkstemp(prefix=f"warmfleet-{command}-", suffix=".log")
    with os.fdopen(fd, "wb") as log:  # the child keeps its own copy of the descriptor
        process = subprocess.Popen(
            cmd,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    started = Daemon(f"http://127.0.0.1:{port}", process, log_path)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            code = process.returncode
            raise RuntimeError(f"{command} exited with {code}: {cmd}\n{started.log()}")
        try:
            if httpx.get(f"{started.url}/readyz", timeout=2).status_code == 200:
                return started
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    process.kill()
    raise RuntimeError(f"{command} not ready after {timeout}s: {cmd}\n{started.log()}")
