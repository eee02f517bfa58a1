"""warmfleet's own processes as the benchmarks start them: a daemon (`warmfleet serve`),
a router in front of daemons, a local fleet (`warmfleet up`), and the waits for what
they report (warm prompts warm, a router following every daemon's cache)."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from harness.processes import Proc, free_port, free_ports, launch, wait_until

SERIES = {  # the daemons' own per-request figures, as the benchmarks read them
    "ttft_sum": "gen_ai_server_time_to_first_token_seconds_sum",
    "ttft_count": "gen_ai_server_time_to_first_token_seconds_count",
    "queried": "warmfleet_prefix_cache_queried_tokens_total",
    "hits": "warmfleet_prefix_cache_hit_tokens_total",
}


def scrape(urls: Sequence[str]) -> dict[str, float]:
    """The totals of SERIES over the daemons at `urls` (summed over label sets)."""
    totals = dict.fromkeys(SERIES, 0.0)
    for url in urls:
        text = httpx.get(f"{url}/metrics", timeout=10).text
        for key, name in SERIES.items():
            for match in re.finditer(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M):
                totals[key] += float(match.group(1))
    return totals


def cli(*args: str, python: str = sys.executable) -> list[str]:
    """`warmfleet ARGS` as `python -m warmfleet_cli` (as `warmfleet up` runs its own)."""
    return [python, "-m", "warmfleet_cli", *args]


def admin_env(token: str | None) -> dict[str, str] | None:
    """This environment with an admin token the daemon and router read (None: unchanged)."""
    return None if token is None else {**os.environ, "WARMFLEET_ADMIN_TOKEN": token}


def serve(
    *options: str,
    model: str = "default",
    token: str | None = None,
    port: int | None = None,
    **launching: Any,
) -> Proc:
    """`warmfleet serve --model MODEL OPTIONS`, ready once /readyz says 200; `token`: its
    admin token; `launching`: launch()'s options (env, log, poll, ...)."""
    port = port or free_port()
    cmd = cli("serve", "--model", model, "--port", str(port), *options)
    launching.setdefault("env", admin_env(token))
    launching.setdefault("name", "warmfleet serve")
    return launch(cmd, port, "/readyz", **launching)


def router(
    backends: Sequence[str],
    *options: str,
    token: str | None = None,
    port: int | None = None,
    python: str = sys.executable,
    ready: str = "/readyz",
    **launching: Any,
) -> Proc:
    """`warmfleet router --backend URL... OPTIONS`, ready once `ready` says 200; `python`:
    the interpreter of another warmfleet build."""
    port = port or free_port()
    cmd = cli("router", *(a for url in backends for a in ("--backend", url)), python=python)
    cmd += ["--port", str(port), *options]
    launching.setdefault("env", admin_env(token))
    launching.setdefault("name", "warmfleet router")
    return launch(cmd, port, ready, **launching)


def wait_following(
    url: str, headers: dict[str, str] | None = None, timeout: float = 60, poll: float = 0.1
) -> None:
    """Until the router follows every daemon's cache (its index reads their events)."""

    def following() -> bool:
        status = httpx.get(f"{url}/v1/router/status", headers=headers, timeout=30).json()
        modes = [b["index"]["mode"] for b in status["backends"]]
        return bool(modes) and all(mode == "following" for mode in modes)

    wait_until(following, f"the router {url} following every daemon", timeout=timeout, poll=poll)


def wait_warm(url: str, timeout: float = 3600, poll: float = 0.5) -> None:
    """Until the daemon's warm prompts are warm (/readyz?warm=1). Gently: polling takes
    CPU from the engine on 2 cores."""

    def warm() -> bool:
        return httpx.get(f"{url}/readyz", params={"warm": 1}, timeout=10).status_code == 200

    wait_until(warm, f"{url} warm", timeout=timeout, poll=poll)


@dataclass
class Up:
    """A `warmfleet up` fleet: its router, its daemons and its admin token."""

    proc: Proc
    url: str
    daemons: list[str]
    token: str


@contextmanager
def up(folder: Path, nodes: int, *options: str, timeout: float = 300) -> Iterator[Up]:
    """`warmfleet up --nodes N OPTIONS --dir FOLDER` (its output in folder/up.log), once
    its daemons answer; stopped (SIGINT) at the block's end."""
    port = free_ports(nodes + 1)
    folder.mkdir(parents=True, exist_ok=True)
    cmd = cli("up", "--nodes", str(nodes), *options, "--port", str(port), "--dir", str(folder))
    daemons = [f"http://127.0.0.1:{port + 1 + i}" for i in range(nodes)]
    token_file = folder / "admin-token"

    def answering() -> bool:
        token_file.read_text()  # written before the daemons start
        return all(httpx.get(f"{d}/readyz", timeout=5).status_code == 200 for d in daemons)

    with launch(
        cmd, port, None, name="warmfleet up", log=folder / "up.log", stop_timeout=60
    ) as proc:
        wait_until(answering, "warmfleet up's daemons", timeout=timeout, poll=1, proc=proc)
        yield Up(proc, proc.url, daemons, token_file.read_text().strip())
