"""Claude Code's and Codex's first request against a cold fleet and a warm one, as the
CLIs themselves report it; and what vllm-mlx 0.6.0's /v1/messages does with Claude
Code's request on the same weights.

    .venv/bin/python bench/agents_ttft.py --agents ~/agents [--runs 2] [--json out.json]

--agents is a directory where `npm install @anthropic-ai/claude-code@2.1.332
@openai/codex@0.171.0` was run. vllm-mlx lives in its own virtualenv (see
bench/decode_c8.py); without it that part is skipped.

Set-up, as a user would do it: each CLI is captured once (`warmfleet warm-prompts
capture`) from the HOME and project directory its sessions then run in, into one
warm-prompts file. Then, all on the embedded SmolLM2-135M (float32 on a CPU):

cold      `warmfleet up --nodes 2 --model default --max-context 32768
          --max-output-tokens 128`: before each run every daemon's prefix cache is
          cleared (DELETE /v1/cache/prefix).
warm      the same with `--warm FILE`, once both daemons hold it warm. With --rewarm the
          caches are cleared and re-warmed before each round, so a run reads the warm
          prompt and nothing an earlier session left; without it (the default: a
          re-warm costs both daemons the cold prefill of both prompts) a later round
          may also read the part of the first user message before the user's words
          (Claude Code's ~130-token system-reminder), as a user's second session would.
vllm-mlx  `vllm-mlx serve DIR --continuous-batching` on `warmfleet convert default
          DIR`: Claude Code's first turn, then `--resume` for a second.

Each run is a new session in the same project directory, with a prompt of its own
(another first word). Figures per run:

Claude Code  the time from starting `claude` to the first text (or tool input) it
             streams (`--output-format stream-json --include-partial-messages`): its
             first request's time to first token as the CLI sees it, plus its own start
             (~0.2 s). Its result's `ttft_ms` is recorded as well, but it is not that:
             against a fake server that streams text from 1 s to 8 s, Claude Code 2.1.332
             reports ttft_ms 8,158 (the end of its first message). That request's prompt
             and `cache_read_input_tokens` come from its first assistant event.
             CLAUDE_CODE_MAX_OUTPUT_TOKENS keeps its answers short (an answer cut there is
             continued by Claude Code in a further request).
Codex        the time from `turn.started` to its first event after it in `codex exec
             --json` (it does not stream text: this includes writing its first message
             or call, at most --max-output-tokens, which Codex 0.171 reads as a full
             context when it cuts the answer), after which the run is stopped. Its
             provider has `stream_idle_timeout_ms = 3600000`: a cold prefill here takes
             longer than its default 300 s without an SSE event (keep-alive comments do
             not count), after which it gives up on the stream and sends it again.
both         the daemons' own TTFT of the first request and its cached share of the
             prompt (gen_ai.server.time_to_first_token and the prefix-cache token
             counters, read from each daemon's /metrics as they are recorded).

Timed runs wait until the machine's 1-minute load average is below --max-load (other
people's work on a shared machine); the load is printed with each run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
from harness import peers, warmfleet
from harness.processes import free_port
from harness.warmfleet import SERIES, scrape

MODEL = "SmolLM2-135M-Instruct"  # the served name (Claude Code reads "default" as its alias)
CONTEXT = 32768
WORDS = ["Which", "What", "List", "Name", "Show", "Tell", "Describe", "Find"]


def prompt(i: int) -> str:
    return f"{WORDS[i % len(WORDS)]} files are in this project, briefly?"


# -- the machine ------------------------------------------------------------------------


def load() -> float:
    return os.getloadavg()[0]


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def quiet(max_load: float, patience: float) -> str:
    """Wait (at most `patience` s) for the load average to drop below `max_load`."""
    deadline = time.monotonic() + patience
    while load() > max_load and time.monotonic() < deadline:
        time.sleep(15)
    return uptime()


# -- the daemons' own figures ------------------------------------------------------------


class FirstRequest:
    """Polls the daemons' /metrics during a run; keeps the figures of the moment the
    first request's first token was recorded (the CLIs send one request at a time)."""

    def __init__(self, urls: list[str]) -> None:
        self.urls = urls
        self.base = scrape(urls)
        self.first: dict[str, float] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.is_set() and self.first is None:
            self._check()
            self._stop.wait(0.2)

    def _check(self) -> None:
        with contextlib.suppress(httpx.HTTPError):
            now = scrape(self.urls)
            if now["ttft_count"] > self.base["ttft_count"]:
                self.first = {k: now[k] - self.base[k] for k in SERIES}

    def wait(self, timeout: float) -> None:
        """Until the first request was recorded (at its end: a request cut short by its
        client is not recorded at all) or `timeout` s passed."""
        self._thread.join(timeout=timeout)

    def stop(self) -> dict[str, float] | None:
        self._stop.set()
        self._thread.join(timeout=30)
        if self.first is None:  # it may have been recorded after the last poll
            self._check()
        return self.first


# -- the fleet ---------------------------------------------------------------------------


@dataclass
class Fleet:
    url: str
    daemons: list[str]
    token: str

    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def clear(self, warm: bool) -> float:
        """Clear every daemon's prefix cache; with a warm set, wait until it is warm
        again. Returns the seconds that took."""
        started = time.monotonic()
        self.settle()
        for url in self.daemons:
            httpx.delete(f"{url}/v1/cache/prefix", headers=self.auth(), timeout=30)
        if warm:
            self.wait_warm()
        return time.monotonic() - started

    def wait_warm(self, timeout: float = 7200, prompts: int = 2) -> None:
        """Until every daemon holds `prompts` warm prompts warm (the operator pushes the
        set a few seconds after start: an empty daemon is "warm" before that)."""
        deadline = time.monotonic() + timeout
        for url in self.daemons:
            while True:
                with contextlib.suppress(httpx.HTTPError, ValueError):
                    body = httpx.get(f"{url}/v1/warm-sets", headers=self.auth(), timeout=10).json()
                    states = [p["state"] for s in body["sets"] for p in s["prompts"]]
                    if states.count("warm") >= prompts:
                        break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{url} not warm in {timeout:.0f} s")
                time.sleep(5)

    def settle(self, timeout: float = 1800) -> None:
        """Until no daemon has work in flight: the next-turn prefill a session's answer
        starts (idle priority) would otherwise store its blocks after a clear."""
        deadline = time.monotonic() + timeout
        for url in self.daemons:
            while time.monotonic() < deadline:
                with contextlib.suppress(httpx.HTTPError, ValueError):
                    status = httpx.get(f"{url}/v1/status", headers=self.auth(), timeout=10).json()
                    if not _busy(status):
                        break
                time.sleep(2)

    def warm_tokens(self) -> dict[str, int]:
        body = httpx.get(f"{self.daemons[0]}/v1/warm-sets", headers=self.auth(), timeout=10).json()
        return {p["name"]: p["tokens"] for s in body["sets"] for p in s["prompts"]}


def _busy(status: dict[str, Any]) -> bool:
    engine = status.get("engine") or {}
    keys = ("running", "prefilling", "waiting", "idle_waiting")
    pending = int((status.get("next_turn") or {}).get("pending") or 0)
    return pending + sum(int(engine.get(k) or 0) for k in keys) > 0


@contextlib.contextmanager
def fleet(folder: Path, nodes: int, warm: Path | None, max_output: int) -> Iterator[Fleet]:
    """`warmfleet up` (its output in folder/up.log), once its daemons answer."""
    options = ["--model", "default", "--max-context", str(CONTEXT)]
    options += ["--max-output-tokens", str(max_output)]
    if warm:
        options += ["--warm", str(warm)]
    with warmfleet.up(folder, nodes, *options) as f:
        yield Fleet(f.url, f.daemons, f.token)


# -- the CLIs ----------------------------------------------------------------------------


@dataclass
class Project:
    home: Path
    work: Path
    agents: Path
    max_output: int
    claude_settings: dict[str, str] = field(default_factory=dict)  # --claude-env

    def bin(self, cli: str) -> Path:
        return self.agents / "node_modules" / ".bin" / cli

    def claude_env(self, url: str) -> dict[str, str]:
        return {
            "PATH": os.environ["PATH"],
            "HOME": str(self.home),
            "ANTHROPIC_BASE_URL": url,
            "ANTHROPIC_API_KEY": "unused",
            "ANTHROPIC_MODEL": MODEL,
            "ANTHROPIC_SMALL_FAST_MODEL": MODEL,
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(self.max_output),
            **self.claude_settings,
        }

    def codex_env(self, url: str, model: str = MODEL) -> dict[str, str]:
        (self.home / "config.toml").write_text(
            f'model = "{model}"\nmodel_provider = "warmfleet"\n'
            "[model_providers.warmfleet]\n"
            f'name = "warmfleet"\nbase_url = "{url}/v1"\nwire_api = "responses"\n'
            'env_key = "WARMFLEET_API_KEY"\n'
            # A cold prefill here outlasts Codex's 300 s default: keep-alives are SSE
            # comments, which its idle timer does not count (it retries the request).
            "stream_idle_timeout_ms = 3600000\n"
        )
        return {
            "PATH": os.environ["PATH"],
            "HOME": str(self.home),
            "CODEX_HOME": str(self.home),
            "WARMFLEET_API_KEY": "unused",
        }


@dataclass
class Run:
    cli: str
    where: str
    load: str
    wall_s: float = 0.0
    ttft_ms: float | None = None  # Claude Code: to its first streamed text; Codex: first item
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    server_ttft_s: float | None = None
    server_prompt_tokens: int | None = None
    server_cached_tokens: int | None = None
    is_error: bool = False
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


@contextlib.contextmanager
def agent(
    command: list[str], env: dict[str, str], cwd: Path, stderr: int
) -> Iterator[subprocess.Popen[str]]:
    """A CLI's run, its output read line by line (`.stdout`), killed after two hours;
    waited for at the block's end."""
    with subprocess.Popen(
        command, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=stderr, text=True,
    ) as proc:  # fmt: skip
        timer = threading.Timer(7200, proc.kill)
        timer.start()
        try:
            yield proc
        finally:
            timer.cancel()


def claude_run(
    project: Project, url: str, text: str, where: str, *args: str, daemons: list[str]
) -> Run:
    run = Run("claude", where, uptime())
    probe = FirstRequest(daemons) if daemons else None
    command = [
        str(project.bin("claude")), "-p", text, "--output-format", "stream-json", "--verbose",
        "--include-partial-messages", *args,
    ]  # fmt: skip
    started = time.monotonic()
    lines: list[str] = []
    with agent(command, project.claude_env(url), project.work, subprocess.STDOUT) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if run.ttft_ms is None and '"content_block_delta"' in line:
                run.ttft_ms = (time.monotonic() - started) * 1000
    run.wall_s = time.monotonic() - started
    events = [json.loads(line) for line in lines if line.startswith("{")]
    results = [e for e in events if e.get("type") == "result"]
    if not results:
        run.is_error, run.note = True, "".join(lines)[-500:]
    else:
        result = results[0]
        run.is_error = bool(result.get("is_error"))
        run.note = str(result.get("result"))[:160] if run.is_error else ""
        run.extra = {
            "session_id": result.get("session_id"),
            "num_turns": result.get("num_turns"),
            # What Claude Code calls ttft_ms: the end of its first message, not its first
            # token (measured against a fake server streaming for seconds: PERFORMANCE.md).
            "claude_ttft_ms": result.get("ttft_ms"),
        }
    usages = [e["message"]["usage"] for e in events if e.get("type") == "assistant"]
    if usages:
        u = usages[0]
        keys = ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
        run.prompt_tokens = sum(int(u.get(k) or 0) for k in keys)
        run.cached_tokens = int(u.get("cache_read_input_tokens") or 0)
    if probe:
        _server(run, probe.stop())
    return run


def codex_run(project: Project, url: str, text: str, where: str, daemons: list[str]) -> Run:
    run = Run("codex", where, uptime())
    probe = FirstRequest(daemons)
    command = [str(project.bin("codex")), "exec", "--json", "--skip-git-repo-check", text]
    started = time.monotonic()
    turn_started: float | None = None
    with agent(command, project.codex_env(url), project.work, subprocess.DEVNULL) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            if not line.startswith("{"):
                continue
            event = json.loads(line)
            now = time.monotonic()
            if event["type"] == "turn.started":
                turn_started = now
            elif turn_started is not None:
                # Its first output (an item, or the error of a response cut at the limit).
                run.ttft_ms = (now - turn_started) * 1000
                run.extra = {"first_event": event["item"]["type"] if "item" in event else event}
                run.is_error = event["type"] in ("error", "turn.failed")
                # The rest is the model's length, not the first request; but stopping Codex
                # before the daemon has finished that response would cancel it unrecorded.
                probe.wait(timeout=120)
                proc.terminate()
                break
        proc.wait()
    run.wall_s = time.monotonic() - started
    _server(run, probe.stop())
    run.prompt_tokens, run.cached_tokens = run.server_prompt_tokens, run.server_cached_tokens
    return run


def _server(run: Run, first: dict[str, float] | None) -> None:
    if first:
        run.server_ttft_s = first["ttft_sum"]
        run.server_prompt_tokens = int(first["queried"])
        run.server_cached_tokens = int(first["hits"])


def capture(project: Project, out: Path, clis: Sequence[str]) -> None:
    """The CLIs' warm prompts, captured from the project directory into `out`."""
    for cli in clis:
        port = free_port()
        cap = subprocess.Popen(
            warmfleet.cli("warm-prompts", "capture", "--port", str(port), "--out", str(out),
                          "--timeout", "120"),
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        while True:
            with contextlib.suppress(OSError):
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            time.sleep(0.1)
        if cli == "claude":
            claude_run(project, url, "say hi", "capture", daemons=[])
        else:
            subprocess.run(
                [str(project.bin("codex")), "exec", "--json", "--skip-git-repo-check", "say hi"],
                env=project.codex_env(url), cwd=project.work, capture_output=True,
                stdin=subprocess.DEVNULL, timeout=120,
            )  # fmt: skip
        _, err = cap.communicate(timeout=60)
        if cap.returncode != 0:
            raise RuntimeError(f"capture of {cli} failed: {err}")


# -- vllm-mlx ----------------------------------------------------------------------------


@contextlib.contextmanager
def vllm_mlx_served(binary: Path, model_dir: str, log: Path) -> Iterator[str]:
    """vllm-mlx serving the weights as MODEL (its output in `log`)."""
    home = log.parent / "vllm-mlx-home"
    options = ("--served-model-name", MODEL)
    launching: dict[str, Any] = {"log": log, "timeout": 600, "poll": 1, "stop_timeout": 60}
    with peers.vllm_mlx(binary, model_dir, *options, home=home, **launching) as s:
        yield s.url


def versions(project: Project, vllm_mlx: Path) -> dict[str, str]:
    out = {}
    for cli in ("claude", "codex"):
        done = subprocess.run([str(project.bin(cli)), "--version"], capture_output=True, text=True)
        out[cli] = done.stdout.strip()
    python = vllm_mlx.parent / "python"
    if python.exists():
        code = "import importlib.metadata as m; print(*(m.version(p) for p in PEERS))"
        code = code.replace("PEERS", repr(("vllm-mlx", "mlx", "mlx-lm")))
        shown = subprocess.run([str(python), "-c", code], capture_output=True, text=True)
        out["peer vllm-mlx, mlx, mlx-lm"] = shown.stdout.strip()
    return out


# -- the report --------------------------------------------------------------------------


def spread(values: list[float]) -> str:
    if not values:
        return "-"
    med = statistics.median(values)
    return f"{med:9.1f} [{min(values):.1f}-{max(values):.1f}] n={len(values)}"


def report(runs: list[Run]) -> None:
    print("\nper run:")
    for r in runs:
        share = f"{(r.cached_tokens or 0) / r.prompt_tokens:.0%}" if r.prompt_tokens else "-"
        server = f"{r.server_ttft_s:.1f}s" if r.server_ttft_s is not None else "-"
        ttft = f"{r.ttft_ms / 1000:.1f}s" if r.ttft_ms is not None else "-"
        print(
            f"  {r.cli:6} {r.where:9} ttft {ttft:>8}  server {server:>8}  "
            f"cached {r.cached_tokens}/{r.prompt_tokens} ({share})  wall {r.wall_s:.0f}s"
            f"{'  ERROR ' + r.note if r.is_error else ''}  [load {r.load.split('average:')[-1]}]"
        )
    print("\nmedians [min-max] (s):")
    for cli in ("claude", "codex"):
        cold = [r for r in runs if r.cli == cli and r.where == "cold"]
        warm = [r for r in runs if r.cli == cli and r.where == "warm"]
        for label, key in (("own ttft", "ttft_ms"), ("server ttft", "server_ttft_s")):
            scale = 1000 if key == "ttft_ms" else 1
            c = [getattr(r, key) / scale for r in cold if getattr(r, key) is not None]
            w = [getattr(r, key) / scale for r in warm if getattr(r, key) is not None]
            ratio = f"{statistics.median(w) / statistics.median(c):.3f}x" if c and w else "-"
            print(f"  {cli:6} {label:12} cold {spread(c)}  warm {spread(w)}  warm/cold {ratio}")
        shares = [(r.cached_tokens or 0) / r.prompt_tokens for r in warm if r.prompt_tokens]
        if shares:
            low, mid, high = min(shares), statistics.median(shares), max(shares)
            print(f"  {cli:6} warm: first prompt cached {mid:.1%} [{low:.1%}-{high:.1%}]")


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--agents", type=Path, required=True, help="where the CLIs were npm-installed")
    ap.add_argument("--runs", type=int, default=2, help="runs per CLI, cold and warm")
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument(
        "--max-output",
        type=int,
        default=128,
        help="CLAUDE_CODE_MAX_OUTPUT_TOKENS, and the daemons' --max-output-tokens (Codex)",
    )
    ap.add_argument("--max-load", type=float, default=1.5, help="wait for a quieter machine")
    ap.add_argument("--patience", type=float, default=3600, help="seconds to wait for it")
    ap.add_argument("--cli", choices=["claude", "codex"], action="append", help="default: both")
    ap.add_argument("--rewarm", action="store_true", help="re-warm before each warm round")
    ap.add_argument("--only", choices=["cold", "warm", "vllm-mlx"], action="append")
    ap.add_argument("--vllm-mlx", type=Path, default=peers.DEFAULT_VLLM_MLX)
    ap.add_argument("--model-dir", default=None, help="converted model for vllm-mlx")
    ap.add_argument("--dir", type=Path, help="keep the work here (default: a temporary one)")
    ap.add_argument("--json", type=Path, help="also write the raw runs here")
    ap.add_argument(
        "--claude-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a setting for Claude Code's capture and runs, e.g. "
        "CLAUDE_CODE_DISABLE_BUNDLED_SKILLS=1 (its skill list leaves the environment "
        "message that follows the user's words)",
    )
    args = ap.parse_args()
    parts = args.only or ["cold", "warm", "vllm-mlx"]

    root = args.dir or Path(tempfile.mkdtemp(prefix="agents-ttft-"))
    clis = args.cli or ["claude", "codex"]
    if any("=" not in item for item in args.claude_env):
        ap.error("--claude-env takes NAME=VALUE")
    settings = dict(item.split("=", 1) for item in args.claude_env)
    project = Project(root / "home", root / "project", args.agents, args.max_output, settings)
    project.home.mkdir(parents=True, exist_ok=True)
    project.work.mkdir(parents=True, exist_ok=True)
    (project.work / "README.md").write_text("# demo\nA project the agents are asked about.\n")
    warm_file = root / "agents.yaml"
    print(f"work in {root}; {uptime()}")
    print(f"settings: warmfleet up --nodes {args.nodes} --model default --max-context {CONTEXT}"
          f" --max-output-tokens {args.max_output} [--warm {warm_file.name}]; "
          f"CLAUDE_CODE_MAX_OUTPUT_TOKENS={args.max_output} {' '.join(args.claude_env)}; "
          f"{args.runs} runs per CLI and "
          f"fleet; re-warm between warm rounds: {args.rewarm}")  # fmt: skip
    print(f"versions: {versions(project, args.vllm_mlx)}")
    if not warm_file.exists():
        capture(project, warm_file, clis)
    runs: list[Run] = []
    n = 0
    for where in ("cold", "warm"):
        if where not in parts:
            continue
        warm = warm_file if where == "warm" else None
        with fleet(root / f"fleet-{where}", args.nodes, warm, args.max_output) as f:
            if where == "warm":
                started = time.monotonic()
                f.wait_warm(prompts=len(clis))
                print(f"warm: {f.warm_tokens()} in {time.monotonic() - started:.0f}s")
            for i in range(args.runs):
                for cli in clis:
                    took = 0.0
                    if where == "cold":
                        took = f.clear(warm=False)
                    elif cli == clis[0] and i and args.rewarm:
                        # One re-warm per round: the two CLIs' sessions share no prefix.
                        took = f.clear(warm=True)
                    quiet(args.max_load, args.patience)
                    n += 1
                    if cli == "claude":
                        r = claude_run(project, f.url, prompt(n), where, daemons=f.daemons)
                    else:
                        r = codex_run(project, f.url, prompt(n), where, daemons=f.daemons)
                    r.extra["cleared_s"] = round(took, 1)
                    runs.append(r)
                    report([r])
    if "vllm-mlx" in parts and args.vllm_mlx.exists():
        _, model_dir = peers.prepare(args.model_dir)
        with vllm_mlx_served(args.vllm_mlx, model_dir, root / "vllm-mlx.log") as url:
            quiet(args.max_load, args.patience)
            first = claude_run(project, url, prompt(n + 1), "vllm-mlx", daemons=[])
            runs.append(first)
            report([first])
            if first.extra.get("session_id"):
                again = claude_run(
                    project, url, "And the README?", "vllm-mlx", "--resume",
                    str(first.extra["session_id"]), daemons=[],
                )  # fmt: skip
                again.where = "vllm-mlx+1"
                runs.append(again)
                report([again])
    elif "vllm-mlx" in parts:
        print(f"vllm-mlx not found at {args.vllm_mlx}: skipped")
    report(runs)
    print(f"\n{uptime()}")
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in runs], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
