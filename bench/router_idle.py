"""What an idle fleet costs the router: `warmfleet up --engine sim --nodes N` (simulated
Macs, the local operator, the router), then, once it is ready and has settled, the
router's CPU over a window with no request. With `--peer-checkout DIR` a second router
(another checkout's code, e.g. `git worktree add /tmp/parent HEAD~1`) follows the same
daemons over the same window, so two routers are measured side by side.

    .venv/bin/python bench/router_idle.py [--nodes 100] [--window 60] [--runs 3]
        [--peer-checkout /tmp/parent]

CPU is read from /proc: user + system time of the router process itself, as a share of
one core. Its key-worker processes (2 by default, alive and idle: they only parse bodies
over 256 KiB) are not counted. Linux only.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from warmfleet_cli.up import port_free

PROFILE = "m4-max-qwen3-30b-a3b-4bit"


def cpu_seconds(pid: int) -> float:
    """User + system CPU of `pid` (and of children it waited for: none while they live)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = sum(int(f) for f in fields[11:15])  # utime, stime, cutime, cstime
    return ticks / os.sysconf("SC_CLK_TCK")


def free_base(count: int) -> int:
    for base in range(24000, 60000, 311):
        if all(port_free("127.0.0.1", base + i) for i in range(count)):
            return base
    raise RuntimeError("no free ports")


def wait_ready(log: Path, process: subprocess.Popen[bytes], timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while "warmfleet up: ready" not in log.read_text():
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(log.read_text()[-3000:])
        time.sleep(1)


def router_pid(up: int) -> int:
    """The `warmfleet router` child of `warmfleet up`."""
    for child in Path(f"/proc/{up}/task/{up}/children").read_text().split():
        command = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
        if b"router" in command:
            return int(child)
    raise RuntimeError("no router process under warmfleet up")


def one_run(args: argparse.Namespace) -> tuple[float, float | None]:
    with tempfile.TemporaryDirectory() as folder:
        base = free_base(args.nodes + 2)
        log = Path(folder) / "up.log"
        with log.open("wb") as out:
            up = subprocess.Popen(
                [
                    sys.executable, "-m", "warmfleet_cli", "up", "--engine", "sim",
                    "--profile", PROFILE, "--nodes", str(args.nodes), "--port", str(base),
                    "--dir", str(Path(folder) / "fleet"), "--log-level", "warning",
                ],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        peer = None
        try:
            wait_ready(log, up)
            ours = router_pid(up.pid)
            if args.peer_checkout:
                token = Path(folder) / "fleet" / "admin-token"
                backends = [
                    a
                    for i in range(args.nodes)
                    for a in ("--backend", f"http://127.0.0.1:{base + 1 + i}")
                ]
                peer_port = base + args.nodes + 1
                code = ("common", "daemon", "router", "operator", "cli")
                path = os.pathsep.join(str(Path(args.peer_checkout) / c) for c in code)
                peer = subprocess.Popen(
                    [
                        sys.executable, "-m", "warmfleet_cli", "router", *backends,
                        "--port", str(peer_port), "--admin-token-file", str(token),
                        "--log-level", "warning",
                    ],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                    env={**os.environ, "PYTHONPATH": path},
                )  # fmt: skip
                deadline = time.monotonic() + 300
                while time.monotonic() < deadline:
                    with contextlib.suppress(httpx.HTTPError):
                        if httpx.get(f"http://127.0.0.1:{peer_port}/readyz").status_code == 200:
                            break
                    time.sleep(1)
            time.sleep(args.settle)  # the warm-up's reads and events pass
            start = time.monotonic()
            before = cpu_seconds(ours), cpu_seconds(peer.pid) if peer else 0.0
            time.sleep(args.window)
            spent = time.monotonic() - start
            ours_share = (cpu_seconds(ours) - before[0]) / spent
            peer_share = (cpu_seconds(peer.pid) - before[1]) / spent if peer else None
            return ours_share, peer_share
        finally:
            if peer is not None:
                peer.send_signal(signal.SIGINT)
                peer.wait(timeout=60)
            os.killpg(up.pid, signal.SIGINT)
            up.wait(timeout=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--window", type=float, default=60.0)
    parser.add_argument("--settle", type=float, default=45.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--peer-checkout", help="a second router's code (another checkout)")
    args = parser.parse_args()
    ours: list[float] = []
    peers: list[float] = []
    for run in range(args.runs):
        mine, peer = one_run(args)
        ours.append(mine * 100)
        if peer is not None:
            peers.append(peer * 100)
        said = f"run {run + 1}: this router {mine * 100:.1f}% of a core"
        if peer is not None:
            said += f", the peer router {peer * 100:.1f}%"
        print(said, flush=True)
    print(f"{args.nodes} idle simulated backends, {args.window:.0f} s windows, {args.runs} runs:")
    print(
        f"  this router: {statistics.median(ours):.1f}% of a core ({min(ours):.1f}-{max(ours):.1f})"
    )
    if peers:
        spread = f"{min(peers):.1f}-{max(peers):.1f}"
        print(f"  the peer router: {statistics.median(peers):.1f}% ({spread})")


if __name__ == "__main__":
    main()
