"""Real daemons for tests: `warmfleet serve` in a subprocess on 127.0.0.1."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

import httpx


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
    port = port or free_port()
    cmd = [sys.executable, "-m", "warmfleet_daemon.cli", "serve", "--port", str(port), *args]
    if "--log-level" not in args:
        cmd += ["--log-level", "warning"]
    fd, log_path = tempfile.mkstemp(prefix="warmfleet-daemon-", suffix=".log")
    with os.fdopen(fd, "wb") as log:  # the child keeps its own copy of the descriptor
        process = subprocess.Popen(
            cmd,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    daemon = Daemon(f"http://127.0.0.1:{port}", process, log_path)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"daemon exited with {process.returncode}: {cmd}\n{daemon.log()}")
        try:
            if httpx.get(f"{daemon.url}/readyz", timeout=2).status_code == 200:
                return daemon
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    process.kill()
    raise RuntimeError(f"daemon not ready after {timeout}s: {cmd}\n{daemon.log()}")


def start_router(*args: str, timeout: float = 60, port: int | None = None) -> Daemon:
    """`warmfleet router ARGS` on a free port, once its /readyz says a backend is ready."""
    port = port or free_port()
    cmd = [sys.executable, "-m", "warmfleet_daemon.cli", "router", "--port", str(port), *args]
    if "--log-level" not in args:
        cmd += ["--log-level", "warning"]
    fd, log_path = tempfile.mkstemp(prefix="warmfleet-router-", suffix=".log")
    with os.fdopen(fd, "wb") as log:
        process = subprocess.Popen(
            cmd, env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=log, stderr=subprocess.STDOUT
        )
    router = Daemon(f"http://127.0.0.1:{port}", process, log_path)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"router exited with {process.returncode}: {cmd}\n{router.log()}")
        try:
            if httpx.get(f"{router.url}/readyz", timeout=2).status_code == 200:
                return router
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    process.kill()
    raise RuntimeError(f"router not ready after {timeout}s: {cmd}\n{router.log()}")
