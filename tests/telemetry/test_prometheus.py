"""Every dashboard query and rule expression returns data from a real Prometheus
(Debian's) scraping a real daemon on the tiny model while requests flow."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
import yaml

from support.processes import Daemon, free_port, start_router
from support.promql import RULES, dashboard_queries, expand, label_values, rule_exprs

PROMETHEUS = shutil.which("prometheus")
if PROMETHEUS is None and os.path.exists("/etc/debian_version"):
    raise RuntimeError("prometheus is missing: `make test` installs Debian's prometheus")
pytestmark = pytest.mark.skipif(PROMETHEUS is None, reason="no prometheus binary on this machine")

SYSTEM = {"role": "system", "content": "You are Atlas, the platform team's assistant. " * 10}


@pytest.fixture(scope="module")
def daemon(daemon_factory, tmp_path_factory) -> Daemon:
    prompts = tmp_path_factory.mktemp("warm") / "prompts.yaml"
    prompts.write_text(
        json.dumps(
            [
                {"name": "atlas", "messages": [SYSTEM]},
                # fails at warm-up (longer than the context): feeds the warm-up alert
                {"name": "too-long", "messages": [{"role": "system", "content": "word " * 9000}]},
            ]
        )
    )
    # A cache directory under a regular file cannot be made: the disk tier is off at
    # start (feeds the disk-tier alert), and its gauges and counters are still exported.
    blocked = tmp_path_factory.mktemp("disk") / "a-file"
    blocked.write_text("")
    return daemon_factory(
        "--model",
        "tiny-random",
        "--daemon-name",
        "mac-ci",
        "--warm-prompts",
        str(prompts),
        "--cache-dir",
        str(blocked / "kv"),
    )


@pytest.fixture(scope="module")
def router(daemon: Daemon) -> Iterator[Daemon]:
    """A router in front of the daemon: the dashboard's fleet panels read its metrics."""
    r = start_router("--backend", daemon.url)
    yield r
    r.stop()


@pytest.fixture(scope="module")
def prometheus(daemon: Daemon, router: Daemon, tmp_path_factory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("prometheus")
    target = daemon.url.removeprefix("http://")
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(RULES)],
        "scrape_configs": [
            {
                "job_name": "warmfleet-daemons",
                # the second target is down on purpose: it feeds the daemon-down alert
                "static_configs": [{"targets": [target, f"127.0.0.1:{free_port()}"]}],
            },
            {
                "job_name": "warmfleet-router",
                "static_configs": [{"targets": [router.url.removeprefix("http://")]}],
            },
        ],
    }
    (root / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    proc = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={root / 'prometheus.yml'}",
            f"--storage.tsdb.path={root / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/-/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, "prometheus did not start"
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def traffic(daemon: Daemon, router: Daemon, seconds: float) -> None:
    """Warm hits and cold misses, every other pair through the router, for `seconds`."""
    end, i = time.monotonic() + seconds, 0
    while time.monotonic() < end:
        system = SYSTEM if i % 3 == 0 else {"role": "system", "content": f"Unique {i} " * 30}
        body = {
            "model": "tiny-random",
            "messages": [system, {"role": "user", "content": f"request {i}"}],
            "max_tokens": 6,
            "ignore_eos": True,
        }
        via = router if i % 4 < 2 else daemon
        # A session each: its first request (the router learns the shared system prompt
        # from three of them: the first-request hit rate, learned and not).
        session = {"x-session-affinity": f"session-{i}"}
        httpx.post(f"{via.url}/v1/chat/completions", json=body, headers=session, timeout=60)
        i += 1


def query(prometheus: str, expr: str) -> list:
    r = httpx.get(f"{prometheus}/api/v1/query", params={"query": expr}, timeout=30)
    assert r.status_code == 200, f"{expr}\n{r.text}"
    return r.json()["data"]["result"]


def series(prometheus: str, selector: str) -> list:
    r = httpx.get(f"{prometheus}/api/v1/series", params={"match[]": selector}, timeout=30)
    assert r.status_code == 200, f"{selector}\n{r.text}"
    return r.json()["data"]


def test_every_dashboard_query_and_rule_returns_data(daemon, router, prometheus) -> None:
    worker = threading.Thread(target=traffic, args=(daemon, router, 20.0))
    worker.start()
    worker.join()
    failures = []
    for where, expr in dashboard_queries():
        expr = expand(expr, model="tiny-random", rate_interval="15s")
        selector = label_values(expr)
        found = series(prometheus, selector) if selector else query(prometheus, expr)
        if not found or (not selector and all(_nan(r) for r in found)):
            failures.append(f"{where}: {expr}")
    # rules: recording rules are evaluated by Prometheus; alert expressions fire here
    time.sleep(2)
    for name, expr in rule_exprs():
        if not [r for r in query(prometheus, expr) if not _nan(r)]:
            failures.append(f"rule {name}: {expr}")
    alerts = {
        a["labels"]["alertname"]
        for a in httpx.get(f"{prometheus}/api/v1/alerts").json()["data"]["alerts"]
    }
    assert {
        "WarmfleetPrefixCacheHitRateLow",
        "WarmfleetWarmUpFailed",
        "WarmfleetDaemonDown",
        "WarmfleetDiskTierOff",
    } <= alerts
    assert not failures, "no data for:\n" + "\n".join(failures)


def _nan(result: dict) -> bool:
    values = [result["value"]] if "value" in result else result.get("values", [])
    return all(v[1] in ("NaN", "+Inf", "-Inf") for v in values)
