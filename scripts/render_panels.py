"""Render the dashboard's first panels as a picture for the docs, from the dashboard JSON
and real data: a daemon on the embedded model behind a router, Debian's Prometheus
scraping both every second, a few minutes of requests (agents sharing a warm system
prompt, then others with prompts of their own, then a cache clear), and each panel's
queries asked of Prometheus over that window as Grafana would ask them. Writes
docs/dashboard-panels.png.

    .venv/bin/python scripts/render_panels.py [--seconds 150] [--out docs/dashboard-panels.png]

Needs `prometheus` on the PATH (`scripts/setup.sh --test-tools` installs Debian's).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "dashboards" / "warmfleet-prefix-cache.json"
PANELS = 6  # the first panels: hit rate vs TTFT, per daemon, TTFT, saved, bytes, queue
SYSTEM = "You are Atlas, the platform team's assistant: answer in one short sentence. " * 6


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(*args: str, log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "warmfleet_cli", *args], stdout=out, stderr=subprocess.STDOUT
        )


def wait(url: str, seconds: float = 300) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{url} never answered 200")


def traffic(router: str, until: float, clear: str) -> None:
    """Agents sharing the warm system prompt, then fresh prompts, then a cache clear."""
    start = time.monotonic()
    cleared = False
    while time.monotonic() < until:
        share = (time.monotonic() - start) / (until - start)
        if share > 0.7 and not cleared:
            httpx.delete(clear, timeout=30)
            cleared = True
        system = SYSTEM if share < 0.4 or share > 0.7 else f"{uuid.uuid4()} " + SYSTEM
        body = {
            "model": "default",
            "max_tokens": 8,
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": f"Status of service {uuid.uuid4().hex[:6]}?"},
            ],
        }
        httpx.post(f"{router}/v1/chat/completions", json=body, timeout=120)


def expand(expr: str) -> str:
    """Grafana's variables as its "All" picks them, and a 15 s rate interval."""
    values = {"__rate_interval": "15s", "model": ".*", "daemon": ".*", "namespace": ".*"}
    return re.sub(r"\$\{?(\w+)\}?", lambda m: values.get(m.group(1), ".*"), expr)


def series(prometheus: str, expr: str, begin: float, end: float) -> list[dict[str, Any]]:
    answer = httpx.get(
        f"{prometheus}/api/v1/query_range",
        params={"query": expand(expr), "start": begin, "end": end, "step": 2},
        timeout=30,
    ).json()
    return list(answer["data"]["result"])


def legend(fmt: str, labels: dict[str, str]) -> str:
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt) or "value"


def draw(prometheus: str, begin: float, end: float, out: Path) -> None:
    panels = [p for p in json.loads(DASHBOARD.read_text())["panels"] if p["type"] == "timeseries"]
    figure, axes = plt.subplots(3, 2, figsize=(13, 10.5))
    for panel, ax in zip(panels[:PANELS], axes.flat, strict=True):
        right = {
            o["matcher"]["options"]
            for o in panel.get("fieldConfig", {}).get("overrides", [])
            if any(p.get("value") == "right" for p in o["properties"])
        }
        twin = ax.twinx() if right else None
        for target in panel["targets"]:
            where = twin if twin is not None and target["refId"] in right else ax
            for found in series(prometheus, target["expr"], begin, end):
                times = [float(t) - begin for t, _ in found["values"]]
                values = [float(v) for _, v in found["values"]]
                label = legend(target.get("legendFormat", ""), found["metric"])
                where.plot(times, values, label=label, linestyle="--" if where is twin else "-")
        ax.set_title(panel["title"], fontsize=10)
        ax.set_xlabel("seconds", fontsize=8)
        handles = ax.get_legend_handles_labels()
        if twin is not None:
            more = twin.get_legend_handles_labels()
            handles = (handles[0] + more[0], handles[1] + more[1])
            twin.set_ylabel("seconds", fontsize=8)
        if handles[0]:
            ax.legend(*handles, fontsize=7, loc="upper left")
    figure.suptitle("warmfleet dashboard, first panels (embedded model, real Prometheus)")
    figure.tight_layout()
    figure.savefig(out, dpi=80)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=150.0, help="of traffic")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "dashboard-panels.png")
    args = parser.parse_args()
    binary = shutil.which("prometheus")
    if binary is None:
        raise SystemExit("prometheus is not on the PATH (scripts/setup.sh --test-tools)")
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        prompts = work / "prompts.json"
        prompts.write_text(json.dumps([[{"role": "system", "content": SYSTEM}]]))
        daemon_port, router_port, prom_port = free_port(), free_port(), free_port()
        procs = [
            start(
                "serve",
                "--model",
                "default",
                "--port",
                str(daemon_port),
                "--daemon-name",
                "mac-1",
                "--warm-prompts",
                str(prompts),
                log=work / "daemon.log",
            )
        ]
        try:
            daemon = f"http://127.0.0.1:{daemon_port}"
            wait(f"{daemon}/readyz?warm=1")
            procs.append(
                start("router", "--backend", daemon, "--port", str(router_port), log=work / "r.log")
            )
            router = f"http://127.0.0.1:{router_port}"
            wait(f"{router}/readyz")
            config = work / "prometheus.yml"
            config.write_text(
                json.dumps(
                    {
                        "global": {"scrape_interval": "1s"},
                        "scrape_configs": [
                            {"job_name": "warmfleet-daemons",
                             "static_configs": [{"targets": [f"127.0.0.1:{daemon_port}"]}]},
                            {"job_name": "warmfleet-router",
                             "static_configs": [{"targets": [f"127.0.0.1:{router_port}"]}]},
                        ],
                    }
                )
            )  # fmt: skip
            procs.append(
                subprocess.Popen(
                    [
                        binary,
                        f"--config.file={config}",
                        f"--storage.tsdb.path={work / 'tsdb'}",
                        f"--web.listen-address=127.0.0.1:{prom_port}",
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
            prometheus = f"http://127.0.0.1:{prom_port}"
            wait(f"{prometheus}/-/ready")
            begin = time.time()
            until = time.monotonic() + args.seconds
            workers = [
                threading.Thread(target=traffic, args=(router, until, f"{daemon}/v1/cache/prefix"))
                for _ in range(2)
            ]
            for w in workers:
                w.start()
            for w in workers:
                w.join()
            time.sleep(5)  # the last scrapes
            draw(prometheus, begin, time.time(), args.out)
            print(f"wrote {args.out}")
        finally:
            for p in reversed(procs):
                p.terminate()
                p.wait(timeout=60)


if __name__ == "__main__":
    main()
