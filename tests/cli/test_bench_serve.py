"""`warmfleet bench-serve` and `bench-compare` as a user runs them: the CLI in a
subprocess against real servers (warmfleet daemons on the tiny model, and
mlx_lm.server), cold then warm, compared as a table and a PNG plot. Nothing here
asserts speed: only what was measured and reported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from support.processes import Daemon, free_port, interrupt, wait_warm

BENCH = ["--prompts", "short,medium", "--concurrency", "1,2", "--max-tokens", "4"]


def warmfleet(*args: str | Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "warmfleet_cli", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)


def test_cold_then_warm_then_compare(daemon_factory: Callable[..., Daemon], tmp_path: Path) -> None:
    warm_prompts = tmp_path / "agents.json"
    made = warmfleet("bench-serve", *BENCH, "--write-warm-prompts", warm_prompts)
    assert made.returncode == 0, made.stderr
    assert len(json.loads(warm_prompts.read_text())) == 1  # the built-in agent system prompt

    cold_daemon = daemon_factory("--model", "tiny-random")
    warm_daemon = daemon_factory("--model", "tiny-random", "--warm-prompts", str(warm_prompts))
    wait_warm(warm_daemon.url)
    each_cell_fresh = ["--cache-policy", "clear-before-run"]
    cold = warmfleet(
        "bench-serve", "--url", cold_daemon.url, *BENCH, *each_cell_fresh,
        "--tag", "cold", "--output", tmp_path / "cold.csv",
    )  # fmt: skip
    assert cold.returncode == 0, cold.stderr
    assert "bench-serve (cold): tiny-random" in cold.stdout and "wrote 4 rows" in cold.stdout
    warm = warmfleet(
        "bench-serve", "--url", f"{warm_daemon.url}/v1", *BENCH, *each_cell_fresh,
        "--tag", "warm", "--output", tmp_path / "warm.json",
    )  # fmt: skip
    assert warm.returncode == 0, warm.stderr

    cold_rows = _csv_rows(tmp_path / "cold.csv")
    document = json.loads((tmp_path / "warm.json").read_text())
    warm_rows = document["rows"]
    for rows, tag in ((cold_rows, "cold"), (warm_rows, "warm")):
        assert [(r["prompt_set"], int(r["concurrency"])) for r in rows] == [
            ("short", 1),
            ("short", 2),
            ("medium", 1),
            ("medium", 2),
        ]
        for row in rows:
            assert row["tag"] == tag and row["model"] == "tiny-random"
            assert row["server_software"] == "warmfleet 0.1.0"
            assert row["server_counters"] == "/v1/status"
            assert int(row["errors"]) == 0 and int(row["ok"]) == int(row["concurrency"])
            assert float(row["ttft_p50_ms"]) > 0 and float(row["prompt_tokens_mean"]) > 800
    # A cleared cold server computes the first request's whole prompt; a warm one finds
    # its system prompt cached, and the server's own counters agree.
    cold_first = [r for r in cold_rows if r["concurrency"] == "1"]
    warm_first = [r for r in warm_rows if r["concurrency"] == 1]
    assert all(float(r["cached_token_share"]) == 0.0 for r in cold_first)
    assert all(float(r["server_hit_rate"]) == 0.0 for r in cold_first)
    assert all(r["cached_token_share"] > 0.8 for r in warm_first)
    assert all(r["server_hit_rate"] == r["cached_token_share"] for r in warm_first)
    first_cell = document["server_counters"][0]
    assert first_cell["after"]["queried_tokens"] > first_cell["before"]["queried_tokens"]
    finishes = {r["finish_reason"] for r in document["requests"]}
    assert finishes <= {"length", "stop"} and all(r["error"] is None for r in document["requests"])

    plot = tmp_path / "cold-vs-warm.png"
    compared = warmfleet(
        "bench-compare", tmp_path / "cold.csv", tmp_path / "warm.json", "--plot", plot
    )
    assert compared.returncode == 0, compared.stderr
    for text in (
        "TTFT cold vs warm",
        "TTFT cold",
        "TTFT warm",
        "speed-up",
        "tiny-random",
    ):
        assert text in compared.stdout
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    markdown = warmfleet(
        "bench-compare", tmp_path / "cold.csv", tmp_path / "warm.json", "--format", "markdown"
    )
    assert markdown.stdout.startswith("| model | prompts | concurrency | TTFT cold (ms) |")
    assert markdown.stdout.count("\n") == 2 + 4


def test_failures_are_counted_and_reported(tiny_daemon: Daemon, tmp_path: Path) -> None:
    wrong_model = warmfleet(
        "bench-serve", "--url", tiny_daemon.url, "--model", "no-such-model",
        "--concurrency", "2", "--max-tokens", "2", "--format", "json",
    )  # fmt: skip
    assert wrong_model.returncode == 1
    assert "2 of 2 requests failed" in wrong_model.stderr
    assert "HTTP 404: The model `no-such-model` does not exist." in wrong_model.stderr
    (row,) = json.loads(wrong_model.stdout)["rows"]
    assert (row["ok"], row["errors"], row["ttft_p50_ms"]) == (0, 2, None)

    nobody = warmfleet("bench-serve", "--url", f"http://127.0.0.1:{free_port()}")
    assert nobody.returncode == 2 and "cannot reach" in nobody.stderr

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n{oops\n')
    bad_file = warmfleet("bench-serve", "--url", tiny_daemon.url, "--prompts", bad)
    assert bad_file.returncode == 2 and "bad.jsonl:2: not valid JSON" in bad_file.stderr


@pytest.fixture(scope="module")
def mlx_lm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """mlx_lm.server on the tiny model, written as an mlx-lm directory by `warmfleet convert`."""
    model_dir = tmp_path_factory.mktemp("mlx-lm") / "tiny-random"
    converted = warmfleet("convert", "tiny-random", model_dir)
    assert converted.returncode == 0, converted.stderr
    port = free_port()
    log = tmp_path_factory.mktemp("mlx-lm-log") / "server.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "mlx_lm.server", "--model", str(model_dir), "--port", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert process.poll() is None, log.read_text()
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        yield url, str(model_dir)
    finally:
        interrupt(process, timeout=20)


def test_against_mlx_lm_server(mlx_lm_server: tuple[str, str], tmp_path: Path) -> None:
    url, model_dir = mlx_lm_server
    ran = warmfleet(
        "bench-serve", "--url", url, "--model", model_dir, "--prompts", "short",
        "--concurrency", "1,2", "--max-tokens", "4", "--tag", "mlx-lm",
        "--output", tmp_path / "mlx.json",
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    document = json.loads((tmp_path / "mlx.json").read_text())
    assert "BaseHTTP" in document["run"]["server_software"]
    assert document["run"]["server_counters"] == ""  # no /v1/status or /metrics there
    for row in document["rows"]:
        assert row["errors"] == 0 and row["ok"] == row["concurrency"]
        assert row["server_hit_rate"] is None and row["ttft_p50_ms"] > 0
    requests = document["requests"]
    assert all(r["prompt_tokens"] > 800 and r["cached_tokens"] is not None for r in requests)
    assert requests[-1]["cached_tokens"] > 800  # mlx_lm.server's own prompt cache at work

    cannot_clear = warmfleet(
        "bench-serve", "--url", url, "--model", model_dir, "--concurrency", "1",
        "--cache-policy", "clear-before-run",
    )  # fmt: skip
    assert cannot_clear.returncode == 2
    assert "cannot clear its cache" in cannot_clear.stderr


def _csv_rows(path: Path) -> list[dict[str, str]]:
    import csv

    with open(path, newline="") as f:
        return list(csv.DictReader(f))
