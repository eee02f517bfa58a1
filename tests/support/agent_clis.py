"""The real agent CLIs, run headless and offline as a user would (for tests/e2e):
WARMFLEET_AGENTS_DIR names a directory where `npm install
@anthropic-ai/claude-code@2.1.332 @openai/codex@0.171.0 opencode-ai@1.18.33
@qwen-code/qwen-code@0.24.4` was run (the versions the suite was written for); a test
that needs a CLI not found there is skipped."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from support.processes import free_port
from warmfleet_cli.up import QWEN_CODE_TIMEOUT_MS

AGENTS = Path(os.environ.get("WARMFLEET_AGENTS_DIR") or "/nonexistent") / "node_modules" / ".bin"
CLAUDE, CODEX = AGENTS / "claude", AGENTS / "codex"
OPENCODE, QWEN = AGENTS / "opencode", AGENTS / "qwen"
PINNED = {"claude": "2.1.332", "codex": "0.171.0", "opencode": "1.18.33", "qwen": "0.24.4"}


def needs(cli: Path) -> pytest.MarkDecorator:
    return pytest.mark.skipif(
        not cli.exists(), reason=f"{cli.name} not installed (set WARMFLEET_AGENTS_DIR)"
    )


def version(cli: Path) -> str:
    """What `cli --version` says, e.g. `2.1.332 (Claude Code)` or `codex-cli 0.171.0`."""
    done = subprocess.run([str(cli), "--version"], capture_output=True, text=True, timeout=60)
    return done.stdout.strip()


@dataclass
class ClaudeRun:
    """One `claude -p` run: its result (what `--output-format json` prints) and the
    usage of each API request it made, in order (from its stream-json events)."""

    result: dict[str, Any]
    requests: list[dict[str, Any]]


def claude(
    home: Path,
    url: str,
    prompt: str,
    *args: str,
    model: str,
    cwd: Path | None = None,
    max_output_tokens: int | None = None,
    timeout: float = 300,
    check: bool = True,
    env: dict[str, str] | None = None,
) -> ClaudeRun:
    """`claude -p PROMPT --output-format stream-json --verbose ARGS` with HOME=home; with
    `check`, it must exit 0 (a turn that ends in an API error, also a reply cut at
    CLAUDE_CODE_MAX_OUTPUT_TOKENS three times over, exits 1); `env` adds to (or replaces)
    its environment (a real key, a CA)."""
    extra, env = (
        env or {},
        {
            "PATH": os.environ["PATH"],
            "HOME": str(home),
            "ANTHROPIC_BASE_URL": url,
            "ANTHROPIC_API_KEY": "unused",
            "ANTHROPIC_MODEL": model,
            "ANTHROPIC_SMALL_FAST_MODEL": model,
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        },
    )
    if max_output_tokens is not None:
        env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] = str(max_output_tokens)
    env |= extra
    done = subprocess.run(
        [str(CLAUDE), "-p", prompt, "--output-format", "stream-json", "--verbose", *args],
        env=env, cwd=cwd or home, capture_output=True, text=True, timeout=timeout,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 0 or not check, done.stdout + done.stderr
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    (result,) = [e for e in events if e["type"] == "result"]
    usage: dict[str, dict[str, Any]] = {}  # one event per content block, one usage per message
    for event in events:
        if event["type"] == "assistant":
            usage.setdefault(event["message"]["id"], event["message"]["usage"])
    return ClaudeRun(result, list(usage.values()))


@dataclass
class CodexRun:
    """One `codex exec --json` run: its events, and when each arrived (seconds after
    the process started)."""

    events: list[dict[str, Any]] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    stderr: str = ""
    code: int | None = None

    def said(self) -> list[str]:
        return [
            e["item"]["text"]
            for e in self.events
            if e.get("item", {}).get("type") == "agent_message"
        ]

    def items(self, kind: str) -> list[dict[str, Any]]:
        return [
            e["item"]
            for e in self.events
            if e["type"] == "item.completed" and e["item"].get("type") == kind
        ]

    def errors(self) -> list[str]:
        """What failed the turn (`error` and `turn.failed` events), in order."""
        failed = [e for e in self.events if e["type"] in ("error", "turn.failed")]
        return [str(e.get("message") or e.get("error", {}).get("message")) for e in failed]

    def usage(self) -> dict[str, Any]:
        (usage,) = [e["usage"] for e in self.events if e["type"] == "turn.completed"]
        return dict(usage)

    def thread(self) -> str:
        (thread,) = [e["thread_id"] for e in self.events if e["type"] == "thread.started"]
        return str(thread)


def codex_home(
    home: Path, url: str, model: str, idle_timeout_ms: int | None = None
) -> dict[str, str]:
    """CODEX_HOME=home with a Responses model provider at `url` (and its
    `stream_idle_timeout_ms`, when given); the environment."""
    (home / "config.toml").write_text(
        f'model = "{model}"\nmodel_provider = "warmfleet"\n'
        "[model_providers.warmfleet]\n"
        f'name = "warmfleet"\nbase_url = "{url}/v1"\nwire_api = "responses"\n'
        'env_key = "WARMFLEET_API_KEY"\n'
        + (f"stream_idle_timeout_ms = {idle_timeout_ms}\n" if idle_timeout_ms else "")
    )
    return {
        "PATH": os.environ["PATH"],
        "HOME": str(home),
        "CODEX_HOME": str(home),
        "WARMFLEET_API_KEY": "unused",
    }


def codex(
    home: Path,
    url: str,
    prompt: str,
    *args: str,
    model: str,
    cwd: Path | None = None,
    resume: str | None = None,
    timeout: float = 300,
    check: bool = True,
    idle_timeout_ms: int | None = None,
    env: dict[str, str] | None = None,
) -> CodexRun:
    """`codex exec --json --skip-git-repo-check ARGS PROMPT` (with `resume`: `codex exec
    resume THREAD PROMPT`, the thread's next turn), events timed as they arrive; with
    `check`, it must exit 0 (a failed turn exits 1); `env` adds to its environment."""
    env = codex_home(home, url, model, idle_timeout_ms) | (env or {})
    verb = ["resume", resume] if resume else []
    command = [str(CODEX), "exec", "--json", "--skip-git-repo-check", *args, *verb, prompt]
    run = CodexRun()
    start = time.monotonic()
    with tempfile.TemporaryFile("w+") as stderr, subprocess.Popen(
        command, env=env, cwd=cwd or home, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=stderr, text=True,
    ) as proc:  # fmt: skip
        assert proc.stdout is not None
        timer = threading.Timer(timeout, proc.kill)  # a hung CLI must not hang the suite
        timer.start()
        try:
            for line in proc.stdout:
                if line.startswith("{"):
                    run.events.append(json.loads(line))
                    run.times.append(time.monotonic() - start)
            code = proc.wait()
        finally:
            timer.cancel()
        stderr.seek(0)
        run.stderr = stderr.read()
    run.code = code
    assert code == 0 or not check, (
        f"codex exited with {code}: {json.dumps(run.events)}\n{run.stderr}"
    )
    return run


@dataclass
class JsonRun:
    """One run of opencode (`run --format json`: a JSON event a line) or Qwen Code (`-o
    json`: one JSON list of events): its events and its exit."""

    events: list[dict[str, Any]]
    code: int
    output: str

    def session(self) -> str:
        ids = {e.get("sessionID") or e.get("session_id") for e in self.events}
        (session,) = ids - {None}
        return str(session)

    def said(self) -> str:
        """The text the agent printed: opencode's text parts, Qwen Code's result."""
        texts = [e["part"]["text"] for e in self.events if e.get("type") == "text"]
        results = [e.get("result", "") for e in self.events if e.get("type") == "result"]
        return "".join(texts + results)

    def errors(self) -> list[str]:
        failed = [e for e in self.events if e.get("type") == "error" or e.get("is_error")]
        return [json.dumps(e)[:2000] for e in failed]


def opencode(
    home: Path, url: str, prompt: str, *args: str, model: str, cwd: Path, timeout: float = 300
) -> JsonRun:
    """`opencode run --format json -m warmfleet/MODEL ARGS PROMPT` in `cwd`, whose
    opencode.json names the provider at `url` as the README's ready block says."""
    provider = {"npm": "@ai-sdk/openai-compatible", "options": {"baseURL": f"{url}/v1"}}
    config = {"provider": {"warmfleet": {**provider, "models": {model: {}}}}}
    (cwd / "opencode.json").write_text(json.dumps(config))
    command = [str(OPENCODE), "run", "--format", "json", "-m", f"warmfleet/{model}", *args]
    env = {"PATH": os.environ["PATH"], "HOME": str(home)}
    done = subprocess.run(
        [*command, prompt], env=env, cwd=cwd, capture_output=True, text=True,
        timeout=timeout, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return JsonRun(events, done.returncode, done.stdout + done.stderr)


def qwen(
    home: Path, url: str, prompt: str, *args: str, model: str, cwd: Path, timeout: float = 300
) -> JsonRun:
    """`qwen --auth-type openai -o json ARGS PROMPT` with OPENAI_BASE_URL at `url` and
    the request timeout the ready block of `warmfleet up` sets (Qwen Code's 120 s is less
    than a cold CPU prefill of its first request)."""
    env = {
        "QWEN_CODE_API_TIMEOUT_MS": str(QWEN_CODE_TIMEOUT_MS),
        "PATH": os.environ["PATH"],
        "HOME": str(home),
        "OPENAI_BASE_URL": f"{url}/v1",
        "OPENAI_API_KEY": "unused",
        "OPENAI_MODEL": model,
    }
    done = subprocess.run(
        [str(QWEN), "--auth-type", "openai", "-o", "json", *args, prompt], env=env, cwd=cwd,
        capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    start = done.stdout.find("[")
    events = json.loads(done.stdout[start:]) if start >= 0 else []
    return JsonRun(events, done.returncode, done.stdout + done.stderr)


@contextmanager
def capturing(out: Path, timeout: float = 300) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """`warmfleet warm-prompts capture --out OUT` listening; yields its URL and process."""
    port = free_port()
    command = [sys.executable, "-m", "warmfleet_cli", "warm-prompts", "capture"]
    proc = subprocess.Popen(
        [*command, "--port", str(port), "--out", str(out), "--timeout", str(timeout)],
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


def finish(proc: subprocess.Popen[str]) -> dict[str, Any]:
    """The capture's exit and the WarmPromptSet it printed."""
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    return dict(yaml.safe_load(out))
