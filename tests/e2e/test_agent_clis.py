"""`warmfleet warm-prompts capture` against the real agent CLIs, then the captured warm
prompt against the agents' next session (opt-in: `pytest --e2e`, with
WARMFLEET_AGENTS_DIR naming a directory where `npm install @anthropic-ai/claude-code
@openai/codex` was run; skipped when a CLI is not there).

Each CLI runs headless and offline, as a user would: pointed at the capture endpoint it
ends its session cleanly with the capture's short reply; then, pointed at a daemon that
warmed the captured file (a scripted model, so the reply is short and ends: the prefill,
the prefix cache and the APIs are the real ones), its first request of another session
(another prompt) reports the whole warm prompt as cached.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from support.engine import model
from support.processes import free_port, serving
from support.scripted import NAME, ScriptedModel
from warmfleet_daemon.api.app import create_app
from warmfleet_daemon.engine.core import Engine, EngineConfig
from warmfleet_daemon.models.loader import LoadedModel
from warmfleet_daemon.settings import DaemonSettings

pytestmark = pytest.mark.e2e
AGENTS = Path(os.environ.get("WARMFLEET_AGENTS_DIR") or "/nonexistent") / "node_modules" / ".bin"
CLAUDE, CODEX = AGENTS / "claude", AGENTS / "codex"
ANSWER = "Hello from the warm fleet."
TIMEOUT = 300


def needs(cli: Path) -> pytest.MarkDecorator:
    return pytest.mark.skipif(
        not cli.exists(), reason=f"{cli.name} not installed (set WARMFLEET_AGENTS_DIR)"
    )


@contextmanager
def capturing(out: Path) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    port = free_port()
    command = [sys.executable, "-m", "warmfleet_cli", "warm-prompts", "capture"]
    proc = subprocess.Popen(
        [*command, "--port", str(port), "--out", str(out), "--timeout", str(TIMEOUT)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr
            time.sleep(0.05)
    try:
        yield url, proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


@contextmanager
def warm_daemon(warm_prompts: Path) -> Iterator[tuple[str, dict[str, int]]]:
    """A daemon (scripted model, a context the agents' ~13k-token requests fit in) that
    warms `warm_prompts`; yields its URL and each prompt's warmed tokens."""
    tokenizer = model("tiny-random").tokenizer
    scripted = ScriptedModel(tokenizer, ANSWER)
    loaded = LoadedModel(scripted, tokenizer, NAME, "a script", 32768, False)  # type: ignore[arg-type]
    engine = Engine(loaded, EngineConfig(block_size=32, cache_budget_bytes=1 << 28))
    settings = DaemonSettings(model=NAME, default_temperature=0.0, warm_prompts=str(warm_prompts))
    with serving(create_app(settings, engine=engine)) as url:
        deadline = time.monotonic() + TIMEOUT
        while httpx.get(f"{url}/readyz", params={"warm": 1}).status_code != 200:
            assert time.monotonic() < deadline, httpx.get(f"{url}/v1/warm-sets").text
            time.sleep(0.2)
        sets = httpx.get(f"{url}/v1/warm-sets").json()["sets"]
        yield url, {p["name"]: p["tokens"] for s in sets for p in s["prompts"]}


def claude(home: Path, url: str, prompt: str) -> dict[str, Any]:
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(home),
        "ANTHROPIC_BASE_URL": url,
        "ANTHROPIC_API_KEY": "unused",
        "ANTHROPIC_MODEL": NAME,
        "ANTHROPIC_SMALL_FAST_MODEL": NAME,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
    done = subprocess.run(
        [str(CLAUDE), "-p", prompt, "--output-format", "json"],
        env=env, cwd=home, capture_output=True, text=True, timeout=TIMEOUT,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return dict(json.loads(done.stdout))


def codex(home: Path, url: str, prompt: str) -> list[dict[str, Any]]:
    (home / "config.toml").write_text(
        f'model = "{NAME}"\nmodel_provider = "warmfleet"\n'
        "[model_providers.warmfleet]\n"
        f'name = "warmfleet"\nbase_url = "{url}/v1"\nwire_api = "responses"\n'
        'env_key = "WARMFLEET_API_KEY"\n'
    )
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "CODEX_HOME": str(home)}
    done = subprocess.run(
        [str(CODEX), "exec", "--skip-git-repo-check", "--json", prompt],
        env={**env, "WARMFLEET_API_KEY": "unused"},
        cwd=home, capture_output=True, text=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def finish(proc: subprocess.Popen[str]) -> dict[str, Any]:
    """The capture's exit and the WarmPromptSet it printed."""
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    return dict(yaml.safe_load(out))


@needs(CLAUDE)
def test_claude_code_is_captured_and_its_next_session_starts_warm(tmp_path: Path) -> None:
    home, out = tmp_path / "home", tmp_path / "agents.yaml"
    home.mkdir()
    with capturing(out) as (url, proc):
        result = claude(home, url, "say hi")
        assert result["is_error"] is False and "captured" in result["result"]
        wps = finish(proc)
    (entry,) = yaml.safe_load(out.read_text())
    assert entry["name"] == "claude-code" and wps["spec"]["prompts"] == [entry]
    assert len(entry["anthropic"]["tools"]) >= 5 and "billing" not in entry["anthropic"]["system"]

    with warm_daemon(out) as (url, tokens):
        result = claude(home, url, "What files are here?")
    assert result["is_error"] is False and result["result"] == ANSWER
    assert result["num_turns"] == 1
    assert result["usage"]["cache_read_input_tokens"] == tokens["claude-code"] > 5000


@needs(CODEX)
def test_codex_is_captured_and_its_next_session_starts_warm(tmp_path: Path) -> None:
    home, out = tmp_path / "home", tmp_path / "agents.json"
    home.mkdir()
    with capturing(out) as (url, proc):
        events = codex(home, url, "say hi")
        said = [
            e["item"]["text"] for e in events if e.get("item", {}).get("type") == "agent_message"
        ]
        assert len(said) == 1 and "captured" in said[0]
        finish(proc)
    (entry,) = json.loads(out.read_text())
    assert entry["name"] == "codex" and entry["responses"]["input"][0]["role"] == "developer"

    with warm_daemon(out) as (url, tokens):
        events = codex(home, url, "What files are here?")
    said = [e["item"]["text"] for e in events if e.get("item", {}).get("type") == "agent_message"]
    assert said == [ANSWER]
    (usage,) = [e["usage"] for e in events if e["type"] == "turn.completed"]
    assert usage["cached_input_tokens"] == tokens["codex"] > 5000
