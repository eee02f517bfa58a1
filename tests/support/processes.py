"""Real processes for tests: `warmfleet serve` and `warmfleet router` in subprocesses on
127.0.0.1 (or `warmfleet serve` run to its refusal), an app served in process by a real
uvicorn, and a stdlib request handler served in process."""

from __future__ import annotations

import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
import uvicorn
from fastapi import FastAPI

from warmfleet_common.tls import TlsOptions, install_https


@dataclass
class Daemon:
    url: str
    process: subprocess.Popen[bytes]
    log_path: str
    verify: ssl.SSLContext | bool = True  # what a client verifies it with (its CA over TLS)

    def log(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def stop(self) -> int:
        return interrupt(self.process)


def interrupt(process: subprocess.Popen[bytes], timeout: float = 30) -> int:
    """Stops `process` as Ctrl-C does (SIGINT), killed if it still runs after `timeout`
    seconds; its exit code."""
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return process.returncode


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_daemon(
    *args: str, timeout: float = 180, env: dict[str, str] | None = None, port: int | None = None
) -> Daemon:
    """`warmfleet serve ARGS` on a free port, once its /readyz says the model is loaded."""
    return _start("serve", args, timeout=timeout, env=env, port=port)


def start_router(
    *args: str, timeout: float = 60, port: int | None = None, ready: str = "/readyz"
) -> Daemon:
    """`warmfleet router ARGS` on a free port, once its /readyz says a backend is ready
    (`ready="/healthz"`: once it answers at all)."""
    return _start("router", args, timeout=timeout, env=None, port=port, ready=ready)


def wait_warm(url: str, timeout: float = 120) -> None:
    """Returns once the daemon at `url` has warmed every warm set it holds (its
    /readyz?warm=1 answers 200); fails the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while httpx.get(f"{url}/readyz", params={"warm": 1}).status_code != 200:
        assert time.monotonic() < deadline, httpx.get(f"{url}/readyz", params={"warm": 1}).text
        time.sleep(0.1)


def serve_refusal(
    *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`warmfleet serve --model tiny-random ARGS` on a free port without an admin token
    (but `env`'s), run until it exits: a refusal to start (the test fails if it serves)."""
    cmd = [sys.executable, "-m", "warmfleet_cli", "serve", "--model", "tiny-random"]
    cmd += ["--port", str(free_port()), *args]
    environ = {k: v for k, v in os.environ.items() if k != "WARMFLEET_ADMIN_TOKEN"}
    try:
        return subprocess.run(
            cmd, env={**environ, **(env or {})}, capture_output=True, text=True, timeout=60
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"`{' '.join(cmd)}` kept running instead of refusing to start")


@contextmanager
def serving(app: FastAPI, tls: TlsOptions | None = None) -> Iterator[str]:
    """`app` served by a real uvicorn on a free port, in a thread of the test process:
    real HTTP (keep-alive, streaming, concurrency) with an engine the test holds; with
    `tls`, HTTPS as `warmfleet serve --tls-cert` serves it."""
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    reloader = install_https(config, tls) if tls is not None else None
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="test-uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield f"{'https' if tls else 'http'}://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        if reloader is not None:
            reloader.stop()


class QuietHandler(BaseHTTPRequestHandler):
    """A stdlib request handler that logs nothing; `send_json` answers 200 with JSON."""

    def log_message(self, *args: object) -> None:
        pass

    def send_json(self, document: object) -> None:
        body = json.dumps(document).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class HandlerServer:
    """`handler` served by a stdlib HTTP server on a free 127.0.0.1 port (`url`), in a
    thread of the test process, until close() (or the end of a `with` block)."""

    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> HandlerServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _start(
    command: str,
    args: tuple[str, ...],
    *,
    timeout: float,
    env: dict[str, str] | None,
    port: int | None,
    ready: str = "/readyz",
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
    # Over TLS (--tls-cert): https, verified with the CA the test passes as --tls-ca.
    tls = "--tls-cert" in args
    scheme = "https" if tls else "http"
    ca = args[args.index("--tls-ca") + 1] if "--tls-ca" in args else None
    verify: ssl.SSLContext | bool = ssl.create_default_context(cafile=ca) if ca else True
    started = Daemon(f"{scheme}://127.0.0.1:{port}", process, log_path, verify)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            code = process.returncode
            raise RuntimeError(f"{command} exited with {code}: {cmd}\n{started.log()}")
        try:
            answer = httpx.get(f"{started.url}{ready}", timeout=2, verify=verify)
            if answer.status_code == 200:
                return started
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    process.kill()
    raise RuntimeError(f"{command} not ready after {timeout}s: {cmd}\n{started.log()}")
