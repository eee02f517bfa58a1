"""The processes a benchmark starts: free ports, a server started and waited for, stopped
gracefully; what a process costs (CPU time, resident memory)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_ports(n: int) -> int:
    """A port with the next n-1 free as well (`warmfleet up` takes consecutive ones)."""
    while True:
        port = free_port()
        with contextlib.ExitStack() as stack:
            try:
                for i in range(n):
                    s = stack.enter_context(socket.socket())
                    s.bind(("127.0.0.1", port + i))
            except OSError:
                continue
        return port


def tmp_log(name: str) -> Path:
    """A log kept after the run, in the temporary directory: `name`.log."""
    return Path(tempfile.gettempdir()) / f"{name}.log"


@dataclass
class Proc:
    """A started server: where it answers, its process and log. As a context manager, it
    is stopped at the block's end."""

    name: str
    url: str
    process: subprocess.Popen[bytes]
    log: Path
    model: str = "default"  # the name its chat API serves
    started_at: float = 0.0  # process start, wall clock (the daemon's log lines carry it)
    port_open_s: float = 0.0  # process start -> the port answers (launch's `ready` set)
    stop_timeout: float = 30.0  # seconds from SIGINT to SIGKILL
    temporary_log: bool = False  # removed when it stops

    def tail(self, chars: int = 4000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self) -> None:
        """SIGINT (a graceful stop), SIGKILL after `stop_timeout` s."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.temporary_log:
            self.log.unlink(missing_ok=True)

    def __enter__(self) -> Proc:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.stop()


def launch(
    cmd: Sequence[str],
    port: int,
    ready: str | None = "/readyz",
    *,
    name: str | None = None,
    model: str = "default",
    env: Mapping[str, str] | None = None,
    cpus: set[int] | None = None,
    log: Path | None = None,
    timeout: float = 300.0,
    poll: float = 0.5,
    stop_timeout: float = 30.0,
) -> Proc:
    """Start `cmd` (it serves on `port`) and time it: polls every 10 ms until the port
    answers, then every `poll` s until GET `ready` says 200 (`ready` None: no wait).
    Polling fast all along would slow what it measures: 100 requests/s take enough CPU on
    2 cores to slow a warm-up by half.

    `env`: its environment (default: this one's); `cpus`: the CPUs it may run on; `log`:
    where its output goes (default: a temporary file, removed when it stops). Raises
    RuntimeError, with the log's end, when it exits first or is not ready in `timeout` s.
    """
    name = name or Path(cmd[0]).name
    temporary = log is None
    if log is None:
        log = Path(tempfile.mkstemp(prefix="bench-server-", suffix=".log")[1])
    affinity = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
    with log.open("wb") as out:
        t0, wall = time.perf_counter(), time.time()
        process = subprocess.Popen(
            list(cmd), env=env, stdout=out, stderr=subprocess.STDOUT, preexec_fn=affinity
        )
    proc = Proc(
        name, f"http://127.0.0.1:{port}", process, log, model, wall,
        stop_timeout=stop_timeout, temporary_log=temporary,
    )  # fmt: skip
    if ready is None:
        return proc
    try:
        port_open = None
        with httpx.Client(timeout=5) as client:
            while True:
                if process.poll() is not None:
                    raise RuntimeError(f"{name} exited with {process.returncode}: {proc.tail()}")
                try:
                    status = client.get(f"{proc.url}{ready}").status_code
                    port_open = port_open or time.perf_counter() - t0
                    if status == 200:
                        break
                except httpx.TransportError:
                    pass
                if time.perf_counter() - t0 > timeout:
                    raise RuntimeError(f"{name} not ready in {timeout:.0f} s: {proc.tail()}")
                time.sleep(0.01 if port_open is None else poll)
    except BaseException:
        proc.stop()
        raise
    assert port_open is not None
    proc.port_open_s = port_open
    return proc


def wait_until(
    check: Callable[[], bool],
    what: str,
    *,
    timeout: float,
    poll: float,
    proc: Proc | None = None,
) -> None:
    """Until `check()` (an HTTP, file or JSON error counts as not yet); RuntimeError when
    `timeout` s pass or `proc` exits first."""
    deadline = time.monotonic() + timeout
    while True:
        if proc is not None and proc.process.poll() is not None:
            raise RuntimeError(f"{proc.name} exited with {proc.process.returncode}: {proc.tail()}")
        with contextlib.suppress(httpx.HTTPError, OSError, ValueError, KeyError):
            if check():
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} not in {timeout:.0f} s")
        time.sleep(poll)


# -- what a process costs (Linux) ----------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """CPU seconds of a process and its children so far."""
    total = 0.0
    for p in [pid, *children(pid)]:
        try:
            fields = Path(f"/proc/{p}/stat").read_bytes().rsplit(b")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            pass
    return total


def children(pid: int) -> list[int]:
    try:
        found = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return []
    return [int(c) for c in found] + [g for c in found for g in children(int(c))]


def rss_mib(pid: int) -> float:
    """A process's resident size."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0
