"""Claude Code, Codex, opencode and Qwen Code against `warmfleet up` on the embedded
model (opt-in: `pytest --e2e`, with WARMFLEET_AGENTS_DIR where `npm install
@anthropic-ai/claude-code@2.1.332 @openai/codex@0.171.0 opencode-ai@1.18.33
@qwen-code/qwen-code@0.24.4` was run; written for those versions; skipped when a CLI is
not there). Slow: the fleet's warm-up prefills ~45k tokens on each daemon (half an hour
on two shared CPU cores).

The CLIs are captured once (`warmfleet warm-prompts capture`, from the HOME and
project directory their sessions then run in: Claude Code and Qwen Code name their
memory directories there in their system prompts, opencode the directory and the day),
into one warm-prompts file (opencode's and Qwen Code's in the chat shape); `warmfleet
up --nodes 2 --model default --max-context 32768 --max-output-tokens 128 --warm FILE`
(router, two daemons, the local operator) warms it on both daemons.
Then, through the router:

- Claude Code, three turns of one session (`claude -p`, `--resume SESSION`,
  `--continue`): the first request of the first turn reads the whole warm prompt from
  the cache, and each later turn's first request reads at least the previous turn's
  last prompt from it.
- Codex, two turns of one thread (`codex exec`, `codex exec resume THREAD`): the first
  turn reads the warm prompt from the cache, the second more than that.
- opencode (`opencode run`, then `--continue`) and Qwen Code (`qwen`, then `--continue`),
  two turns each over chat completions with tools, as the ready block of `warmfleet up`
  says to point them: the same.

No client error: no request gets a 4xx or 5xx from a daemon (the CLIs retry some errors
silently, so the daemons' access logs are read), and each turn ends either well or
because the model did not end its answer within 128 tokens: SmolLM2-135M this far past
its 8,192-token training context rarely does (greedy, it repeats a line to the end;
sampled, seen here from 34 to over 3,000 tokens). Claude Code reports that, after three
retries, as `api_error: "max_output_tokens"` without an HTTP status; Codex 0.171 as
"ran out of room in the model's context window" (how it reads a response `incomplete`
at `max_output_tokens`, which is what OpenAI's API sends at the end of a context).
CLAUDE_CODE_MAX_OUTPUT_TOKENS and `--max-output-tokens` keep the turns mostly prefill.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from support.agent_clis import (
    CLAUDE,
    CODEX,
    OPENCODE,
    PINNED,
    QWEN,
    JsonRun,
    capturing,
    claude,
    codex,
    finish,
    needs,
    opencode,
    qwen,
    version,
)
from support.processes import free_port, interrupt

MODEL = "SmolLM2-135M-Instruct"  # the served name: Claude Code reads "default" as its own alias
CONTEXT = 32768  # Claude Code's first request is ~12.7k tokens, Codex's ~9.1k
WARM_TIMEOUT = 3600  # the warm-up on a loaded 2-core machine took 12.5 min
TURN_TIMEOUT = 1800  # a cold prefill of a whole request, at worst
MAX_OUTPUT = 128  # Claude Code's CLAUDE_CODE_MAX_OUTPUT_TOKENS; the daemons' ceiling (Codex)
CODEX_CUT = "ran out of room in the model's context window"
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(WARM_TIMEOUT + 3 * TURN_TIMEOUT)]


@dataclass
class Fleet:
    url: str
    daemons: list[str]
    warm: dict[str, int]  # each captured prompt's warmed tokens
    log: Path

    def cache_tokens(self) -> tuple[int, int]:
        """The fleet's prefix-cache (hit, queried) token totals, from /metrics."""
        totals = [0.0, 0.0]
        for url in self.daemons:
            text = httpx.get(f"{url}/metrics", timeout=10).text
            for i, name in enumerate(("hit", "queried")):
                pattern = rf"^warmfleet_prefix_cache_{name}_tokens_total(?:{{[^}}]*}})? (\S+)$"
                totals[i] += sum(float(v) for v in re.findall(pattern, text, re.M))
        return int(totals[0]), int(totals[1])

    def errors(self) -> list[str]:
        """The daemons' access-log lines of requests refused or failed."""
        pattern = re.compile(r'"POST \S+ HTTP/1\.1" [45]\d\d')
        return [line for line in self.log.read_text().splitlines() if pattern.search(line)]


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """HOME and the project directory every CLI runs in."""
    root = tmp_path_factory.mktemp("agents")
    home, work = root / "home", root / "project"
    home.mkdir()
    work.mkdir()
    (work / "README.md").write_text("# demo\nA project the agents are asked about.\n")
    return home, work


@pytest.fixture(scope="module")
def captured(project: tuple[Path, Path]) -> Path:
    """Both CLIs' warm prompts, captured from the project directory into one file."""
    home, work = project
    out = work.parent / "agents.yaml"
    if CLAUDE.exists():
        with capturing(out) as (url, proc):
            assert not claude(home, url, "say hi", model=MODEL, cwd=work).result["is_error"]
            finish(proc)
    if CODEX.exists():
        with capturing(out) as (url, proc):
            assert codex(home, url, "say hi", model=MODEL, cwd=work).said()
            finish(proc)
    for cli, run in ((OPENCODE, opencode), (QWEN, qwen)):
        if cli.exists():
            with capturing(out) as (url, proc):
                said = run(home, url, "say hi", model=MODEL, cwd=work, timeout=600)
                assert "captured" in said.said(), said.output
                finish(proc)
    return out


@pytest.fixture(scope="module")
def fleet(captured: Path, record_testsuite_property: Any) -> Iterator[Fleet]:
    folder = captured.parent / "fleet"
    log = captured.parent / "up.log"
    port = free_port()
    while not all(_free(port + i) for i in range(3)):
        port = free_port()
    command = [
        sys.executable, "-m", "warmfleet_cli", "up", "--nodes", "2", "--model", "default",
        "--max-context", str(CONTEXT), "--port", str(port), "--dir", str(folder),
        "--max-output-tokens", str(MAX_OUTPUT), "--warm", str(captured),
    ]  # fmt: skip
    started = time.monotonic()
    with log.open("w") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    try:
        token = _token(folder)
        names = {e["name"] for e in yaml.safe_load(captured.read_text())}
        warm = _warm(port, token, names, proc, log)
        record_testsuite_property("e2e timing: fleet warm", f"{time.monotonic() - started:.0f}s")
        daemons = [f"http://127.0.0.1:{port + i}" for i in (1, 2)]
        yield Fleet(f"http://127.0.0.1:{port}", daemons, warm, log)
    finally:
        interrupt(proc, timeout=60)


def _free(port: int) -> bool:
    from warmfleet_cli.up import port_free

    return port_free("127.0.0.1", port)


def _token(folder: Path) -> str:
    deadline = time.monotonic() + 60
    while not (folder / "admin-token").exists():
        assert time.monotonic() < deadline, "warmfleet up wrote no admin token"
        time.sleep(0.2)
    return (folder / "admin-token").read_text().strip()


def _warm(
    port: int, token: str, names: set[str], proc: subprocess.Popen[bytes], log: Path
) -> dict[str, int]:
    """Wait until both daemons hold every captured prompt warm; their warmed tokens."""
    auth = {"Authorization": f"Bearer {token}"}
    deadline = time.monotonic() + WARM_TIMEOUT
    while True:
        assert proc.poll() is None, log.read_text()[-5000:]
        assert time.monotonic() < deadline, log.read_text()[-5000:]
        states: list[dict[str, Any]] = []
        for daemon in (port + 1, port + 2):
            try:
                sets = httpx.get(f"http://127.0.0.1:{daemon}/v1/warm-sets", headers=auth).json()
            except (httpx.HTTPError, ValueError):
                sets = {"sets": []}
            states += [p for s in sets.get("sets", []) for p in s["prompts"]]
        warm = [p for p in states if p["state"] == "warm"]
        if sorted(p["name"] for p in warm) == sorted([*names, *names]):
            tokens = {p["name"]: p["tokens"] for p in warm}
            assert all(p["tokens"] == tokens[p["name"]] for p in warm)  # the same on both
            return tokens
        time.sleep(5)


def prompt_tokens(usage: dict[str, Any]) -> int:
    """A Messages request's prompt, from its usage."""
    parts = ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
    return sum(int(usage[k]) for k in parts)


def ended(result: dict[str, Any]) -> bool:
    """The turn ended well, or the model did not end its answer within the limit (no
    HTTP error behind it)."""
    cut = result.get("api_error") == "max_output_tokens"
    return (not result["is_error"] or cut) and result.get("api_error_status") is None


@needs(CLAUDE)
def test_claude_code_three_turns_through_the_warm_fleet(
    fleet: Fleet, project: tuple[Path, Path], record_property: Any
) -> None:
    home, work = project
    record_property("e2e version: claude", f"{version(CLAUDE)} (written for {PINNED['claude']})")

    def turn(prompt: str, *args: str) -> Any:
        started = time.monotonic()
        run = claude(
            home, fleet.url, prompt, *args, model=MODEL, cwd=work,
            max_output_tokens=MAX_OUTPUT, timeout=TURN_TIMEOUT,
            check=False,  # judged by ended(): the tiny model may not stop within the limit
        )  # fmt: skip
        result = run.result
        record_property(
            f"e2e timing: claude {' '.join(args) or '-p'}",
            f"{time.monotonic() - started:.0f}s, ttft_ms {result.get('ttft_ms')}, "
            f"{len(run.requests)} requests, is_error {result['is_error']} "
            f"({result.get('api_error')}), first request {run.requests[0]}",
        )
        assert ended(result), result
        return run

    first = turn("What is in this project?")
    session = first.result["session_id"]
    usage = first.requests[0]
    assert usage["cache_read_input_tokens"] >= fleet.warm["claude-code"] > 8000
    assert prompt_tokens(usage) > fleet.warm["claude-code"]

    second = turn("Summarise the README in one line.", "--resume", session)
    assert second.result["session_id"] == session
    assert second.requests[0]["cache_read_input_tokens"] >= prompt_tokens(first.requests[-1]) - 128

    third = turn("Thanks.", "--continue")
    assert third.result["session_id"] == session
    assert third.requests[0]["cache_read_input_tokens"] >= prompt_tokens(second.requests[-1]) - 128
    assert fleet.errors() == []


@needs(CODEX)
def test_codex_two_turns_through_the_warm_fleet(
    fleet: Fleet, project: tuple[Path, Path], record_property: Any
) -> None:
    home, work = project
    record_property("e2e version: codex", f"{version(CODEX)} (written for {PINNED['codex']})")

    def turn(prompt: str, resume: str | None = None) -> tuple[Any, int]:
        """The run and the tokens its requests read from the cache."""
        started, (hits, _) = time.monotonic(), fleet.cache_tokens()
        run = codex(
            home, fleet.url, prompt, model=MODEL, cwd=work, resume=resume,
            timeout=TURN_TIMEOUT, check=False,
        )  # fmt: skip
        cached = fleet.cache_tokens()[0] - hits
        record_property(
            f"e2e timing: codex exec{' resume' if resume else ''}",
            f"{time.monotonic() - started:.0f}s, exit {run.code}, {cached} tokens cached, "
            f"errors {run.errors()}",
        )
        assert all(CODEX_CUT in e for e in run.errors()), run.events
        assert run.code == (1 if run.errors() else 0), run.stderr
        return run, cached

    first, cached = turn("What is in this project?")
    assert cached >= fleet.warm["codex"] > 5000
    second, cached = turn("Summarise the README in one line.", resume=first.thread())
    assert second.thread() == first.thread()
    assert cached > fleet.warm["codex"] + 100  # its history beyond the warm prompt
    assert fleet.errors() == []


@pytest.mark.parametrize(
    ("name", "cli", "run"),
    [
        pytest.param("opencode", OPENCODE, opencode, marks=needs(OPENCODE), id="opencode"),
        pytest.param("qwen-code", QWEN, qwen, marks=needs(QWEN), id="qwen-code"),
    ],
)
def test_chat_agent_two_turns_through_the_warm_fleet(
    fleet: Fleet,
    project: tuple[Path, Path],
    record_property: Any,
    name: str,
    cli: Path,
    run: Any,
) -> None:
    """Two turns of one session of a chat-completions agent (opencode, Qwen Code): the
    first reads the agent's warm prompt from the cache, the second more than that."""
    home, work = project
    record_property(f"e2e version: {cli.name}", f"{version(cli)} (written for {PINNED[cli.name]})")

    def turn(prompt: str, *args: str) -> tuple[JsonRun, int]:
        started, (hits, _) = time.monotonic(), fleet.cache_tokens()
        done = run(home, fleet.url, prompt, *args, model=MODEL, cwd=work, timeout=TURN_TIMEOUT)
        cached = fleet.cache_tokens()[0] - hits
        record_property(
            f"e2e timing: {name} {' '.join(args) or 'first'}",
            f"{time.monotonic() - started:.0f}s, exit {done.code}, {cached} tokens cached, "
            f"said {done.said()[:80]!r}",
        )
        assert done.code == 0 and not done.errors(), done.output[-5000:]
        return done, cached

    first, cached = turn("What is in this project?")
    assert cached >= fleet.warm[name] > 5000
    second, cached = turn("Summarise the README in one line.", "--continue")
    assert second.session() == first.session()
    assert cached > fleet.warm[name] + 100  # its history beyond the warm prompt
    assert fleet.errors() == []


def test_the_pinned_versions_are_the_documented_ones() -> None:
    docs = (Path(__file__).parents[2] / "docs" / "E2E.md").read_text()
    for pinned in PINNED.values():
        assert pinned in (__doc__ or "") and pinned in docs
