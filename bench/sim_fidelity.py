"""The simulated engine against the real one (issue 35's fidelity check): one trace's
requests replayed on the embedded model (`warmfleet serve --model default`) and on the
simulated engine with this machine's measured profile (`warmfleet serve --engine sim
--profile linux-x86-2core-smollm2-135m-f32`), one daemon at a time, at time scale 1.

    .venv/bin/python bench/sim_fidelity.py [--developers 2] [--sessions 5] [--steps 4]
        [--context-tokens 22528] [--max-tokens 8] [--block-size 128]
        [--cache-memory-mb 4096] [--repeats 1] [--replies fixed|engine]
        [--text-cap CHARS] [--json out.json]

The trace is `warmfleet sim trace`'s (no node events, no upgrade): its first `--sessions`
sessions by start, each cut after `--steps` steps, every request built by the replay's
own body builder (`warmfleet_cli.sim.bodies`: Claude Code's Messages, Codex's Responses)
and sent one at a time in trace order, streamed, once the daemon is idle (no request, no
next-turn prefill running): each TTFT is one request's alone, not a queue's. Both
daemons get the same `--block-size`, `--cache-memory-mb` and `--max-context` (the
simulated one would take its block size and budget from the profile otherwise).

Replies. A replay carries each reply into the next request, and the two engines answer
differently (the model its own words, the simulation a fixed text), so their next
requests would differ. `--replies fixed` (default) carries the trace's own text for every
earlier reply instead (what `SessionBodies.request(step)` builds without a reply): both
engines then get byte-identical requests, and their cached tokens must be equal request
by request. `--replies engine` carries each engine's own reply, as `warmfleet sim replay`
does; the requests then differ in the replies, and what is compared is the tokens each
had to compute (prompt less cached), equal when each next-turn prefill covered its own
reply.

Request bounds: each request's `max_tokens` / `max_output_tokens` is at most
`--max-tokens` (8: the embedded model decodes a few tokens a second at these depths on a
CPU), with temperature 0 (the real model's answers, and so its cache's bytes, repeat).
`--text-cap` cuts every text longer than CHARS characters and keeps three tools, for a
quick run; the default sends the agents' full requests (9-13k-token first requests:
minutes of prefill each on 2 cores).

Per request: its class (first request of its agent's head, first request whose head an
earlier session sent, a later user turn, tool results, compaction, the request after a
compaction), prompt tokens, cached tokens on each engine, TTFT on each (as the client
sees its first output event, and the daemon's own `gen_ai.server.time_to_first_token`).
Per class: the median TTFT ratio sim/real with its range, and the requests whose hits
differ.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
from harness.processes import Proc, free_port, launch, tmp_log, wait_until
from harness.warmfleet import cli, scrape

from warmfleet_cli.sim.bodies import BodyOptions, Request, SessionBodies
from warmfleet_cli.sim.trace import Record, TraceParams, generate, read, sessions

PROFILE = "linux-x86-2core-smollm2-135m-f32"
ENGINES = ("real", "sim")
CLASSES = ("first-cold", "first-warm", "user", "tool", "compact", "resume")


@dataclass
class Row:
    """One request on one engine."""

    index: int
    engine: str
    repeat: int
    session: str
    agent: str
    turn: int
    kind: str
    klass: str
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    ttft_s: float | None = None  # the client's: the request sent -> its first output event
    server_ttft_s: float | None = None  # the daemon's gen_ai.server.time_to_first_token
    reply: str = ""
    error: str | None = None

    @property
    def computed(self) -> int:
        return self.prompt_tokens - self.cached_tokens


@dataclass
class EngineRun:
    engine: str
    repeat: int
    rows: list[Row] = field(default_factory=list)
    status: dict[str, Any] = field(default_factory=dict)
    load: tuple[float, float] = (0.0, 0.0)  # 1-minute load average before, after
    seconds: float = 0.0


# -- the requests -------------------------------------------------------------------------


def trace_steps(args: argparse.Namespace) -> tuple[dict[str, Any], list[Record]]:
    """The trace's header and the chosen steps in the order they are sent."""
    if args.trace:
        header, records = read(args.trace)
        chosen = list(records)
    else:
        params = TraceParams(
            developers=args.developers,
            seed=args.seed,
            context_tokens=args.context_tokens,
            upgrades=(),
            node_lost=None,
            nodes_added=None,
            rolling_restart=None,
        )
        trace = generate(params)
        header, chosen = trace.header, trace.records
    by_start = sorted(sessions(chosen).values(), key=lambda steps: steps[0]["t"])
    picked = [s[: args.steps] for s in by_start[: args.sessions]]
    steps = sorted(
        (step for s in picked for step in s), key=lambda r: (r["t"], r["session"], r["turn"])
    )
    return header, steps


def classes(steps: list[Record]) -> list[str]:
    """Each step's class; a first request is `first-warm` when an earlier chosen session
    of the same agent and version sent its static head (system prompt and tools)."""
    heads: set[tuple[str, str]] = set()
    out = []
    for step in steps:
        if step["turn"] == 0:
            head = (step["agent"], step["version"])
            out.append("first-warm" if head in heads else "first-cold")
            heads.add(head)
        else:
            out.append(step["kind"])
    return out


def shaped(request: Request, max_tokens: int, text_cap: int | None) -> dict[str, Any]:
    """The body as sent: its output bounded, greedy, long texts cut with --text-cap."""
    body = copy.deepcopy(request.body)
    key = "max_tokens" if "max_tokens" in body else "max_output_tokens"
    body[key] = min(int(body[key]), max_tokens)
    body["temperature"] = 0.0
    if text_cap is not None:
        body["tools"] = body["tools"][:3]
        body = _capped(body, text_cap)
    return body


def _capped(value: Any, cap: int) -> Any:
    """Every string longer than `cap` characters cut to its first `cap` (a function of
    the string alone: what was shared stays shared)."""
    if isinstance(value, str):
        return value[:cap]
    if isinstance(value, list):
        return [_capped(v, cap) for v in value]
    if isinstance(value, dict):
        return {k: _capped(v, cap) for k, v in value.items()}
    return value


# -- one engine ---------------------------------------------------------------------------


def daemon_command(engine: str, port: int, args: argparse.Namespace) -> list[str]:
    common = ["--port", str(port), "--block-size", str(args.block_size)]
    common += ["--cache-memory-mb", str(args.cache_memory_mb)]
    common += ["--max-context", str(args.context_tokens), "--log-level", "warning"]
    if engine == "real":
        return cli("serve", "--model", "default", *common)
    return cli("serve", "--engine", "sim", "--profile", args.profile, "--sim-speed", "1", *common)


@contextmanager
def daemon(engine: str, args: argparse.Namespace) -> Iterator[Proc]:
    port = free_port()
    log = tmp_log(f"sim-fidelity-{engine}")
    with launch(daemon_command(engine, port, args), port, name=engine, log=log) as proc:
        yield proc


def idle(url: str, client: httpx.Client) -> bool:
    status = client.get(f"{url}/v1/status").json()
    engine, next_turn = status["engine"], status.get("next_turn") or {}
    busy = ("running", "prefilling", "waiting", "idle_waiting")
    return not any(engine.get(k) for k in busy) and not next_turn.get("pending")


def settle(proc: Proc, client: httpx.Client) -> None:
    """Until nothing runs on the daemon (its next-turn prefill included); gently, as a
    poll takes CPU from the engine on 2 cores."""
    wait_until(lambda: idle(proc.url, client), f"{proc.name} idle", timeout=3600, poll=0.25)


def send(client: httpx.Client, url: str, request: Request, body: dict[str, Any], row: Row) -> None:
    """Streams one request; fills the row's usage, TTFT (the client's) and reply text."""
    text: list[str] = []
    sent = time.perf_counter()
    with client.stream("POST", url + request.path, headers=request.headers, json=body) as r:
        if r.status_code != 200:
            detail = r.read().decode(errors="replace")[:300]
            raise RuntimeError(f"HTTP {r.status_code}: {detail}")
        for line in r.iter_lines():
            data = line[5:].strip() if line.startswith("data:") else ""
            if not data or data == "[DONE]":
                continue
            event = json.loads(data)
            output, piece = _output(event)
            if output and row.ttft_s is None:
                row.ttft_s = time.perf_counter() - sent
            text.append(piece)
            _usage(event, row)
    row.reply = "".join(text)


def _output(event: dict[str, Any]) -> tuple[bool, str]:
    """(whether the event carries output, its text)."""
    kind = str(event.get("type", ""))
    if kind == "content_block_delta":  # Messages: text, or a tool call's arguments
        delta = event.get("delta") or {}
        return bool(delta.get("text") or delta.get("partial_json")), str(delta.get("text") or "")
    if kind.startswith("response.") and kind.endswith(".delta"):  # Responses
        piece = str(event.get("delta") or "")
        return bool(piece), piece if kind == "response.output_text.delta" else ""
    return False, ""


def _usage(event: dict[str, Any], row: Row) -> None:
    """Messages' usage: `message_delta`'s is exact (`message_start`'s an estimate); the
    prompt is `input_tokens` + `cache_creation_input_tokens` (up to the last
    `cache_control` breakpoint) + `cache_read_input_tokens`. Responses': its last event's."""
    usage = (
        event.get("usage")
        or (event.get("message") or {}).get("usage")
        or (event.get("response") or {}).get("usage")
    )
    if not isinstance(usage, dict) or "input_tokens" not in usage:
        return
    read_ = usage.get("cache_read_input_tokens")
    if read_ is not None:
        row.cached_tokens = int(read_)
        created = int(usage.get("cache_creation_input_tokens") or 0)
        row.prompt_tokens = int(usage["input_tokens"]) + created + row.cached_tokens
    else:
        row.prompt_tokens = int(usage["input_tokens"])
        row.cached_tokens = int((usage.get("input_tokens_details") or {}).get("cached_tokens", 0))
    row.completion_tokens = int(usage.get("output_tokens") or 0)


def run_engine(
    engine: str,
    repeat: int,
    header: dict[str, Any],
    steps: list[Record],
    klasses: list[str],
    args: argparse.Namespace,
) -> EngineRun:
    run = EngineRun(engine, repeat)
    t0 = time.perf_counter()
    before = os.getloadavg()[0]
    options = BodyOptions.of(header)
    builders: dict[str, SessionBodies] = {}
    replies: dict[str, str] = {}
    with daemon(engine, args) as proc, httpx.Client(timeout=httpx.Timeout(3600, connect=30)) as c:
        print(f"\n{engine} (repeat {repeat + 1}): {proc.url}", flush=True)
        for i, (step, klass) in enumerate(zip(steps, klasses)):
            session = step["session"]
            builder = builders.setdefault(session, SessionBodies(options))
            reply = replies.get(session) if args.replies == "engine" else None
            request = builder.request(step, reply)
            body = shaped(request, args.max_tokens, args.text_cap)
            row = Row(i, engine, repeat, session, step["agent"], step["turn"], step["kind"], klass)
            settle(proc, c)
            ttft_before = scrape([proc.url])
            try:
                send(c, proc.url, request, body, row)
            except (httpx.HTTPError, RuntimeError, ValueError) as exc:
                row.error = f"{type(exc).__name__}: {exc}"
            settle(proc, c)
            ttft_after = scrape([proc.url])
            if ttft_after["ttft_count"] - ttft_before["ttft_count"] == 1:
                row.server_ttft_s = ttft_after["ttft_sum"] - ttft_before["ttft_sum"]
            replies[session] = row.reply
            run.rows.append(row)
            print(
                f"  {i:3d} {klass:10s} {row.prompt_tokens:6d} prompt {row.cached_tokens:6d} "
                f"cached  TTFT {_s(row.ttft_s)} (daemon {_s(row.server_ttft_s)})"
                + (f"  {row.error}" if row.error else ""),
                flush=True,
            )
        run.status = c.get(f"{proc.url}/v1/status").json()
    run.load = (before, os.getloadavg()[0])
    run.seconds = time.perf_counter() - t0
    return run


def _s(seconds: float | None) -> str:
    return "      -" if seconds is None else f"{seconds:7.2f}"


# -- what a run says ----------------------------------------------------------------------


def hits_key(row: Row, replies: str) -> int:
    """What must be equal on both engines: cached tokens of identical requests, or the
    tokens computed when each engine's own replies were carried."""
    return row.cached_tokens if replies == "fixed" else row.computed


def ratio_of(sim: float | None, real: float | None) -> float | None:
    return sim / real if sim is not None and real else None


def median_over(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def report(runs: list[EngineRun], steps: list[Record], args: argparse.Namespace) -> dict[str, Any]:
    by = {(r.engine, r.repeat): r.rows for r in runs}
    repeats = sorted({r.repeat for r in runs})
    per_request = []
    print(
        "\nper request (TTFT: median over repeats, seconds; client's, then the daemon's)\n"
        "    # class        agent        turn  prompt  cached real/sim    TTFT real   sim"
        "  ratio   daemon real   sim  ratio"
    )
    for i, step in enumerate(steps):
        real = [by[("real", k)][i] for k in repeats]
        sim = [by[("sim", k)][i] for k in repeats]
        differ = any(
            hits_key(a, args.replies) != hits_key(b, args.replies) for a, b in zip(real, sim)
        )
        entry = {
            "index": i,
            "class": real[0].klass,
            "agent": step["agent"],
            "session": step["session"],
            "turn": step["turn"],
            "prompt_tokens": {
                "real": [r.prompt_tokens for r in real],
                "sim": [r.prompt_tokens for r in sim],
            },
            "cached_tokens": {
                "real": [r.cached_tokens for r in real],
                "sim": [r.cached_tokens for r in sim],
            },
            "ttft_s": {"real": [r.ttft_s for r in real], "sim": [r.ttft_s for r in sim]},
            "server_ttft_s": {
                "real": [r.server_ttft_s for r in real],
                "sim": [r.server_ttft_s for r in sim],
            },
            "errors": [r.error for r in real + sim if r.error],
            "hits_differ": differ,
        }
        entry["ratio"] = ratio_of(
            median_over(entry["ttft_s"]["sim"]), median_over(entry["ttft_s"]["real"])
        )
        entry["server_ratio"] = ratio_of(
            median_over(entry["server_ttft_s"]["sim"]), median_over(entry["server_ttft_s"]["real"])
        )
        per_request.append(entry)
        cached = (
            "/".join(str(c) for c in entry["cached_tokens"]["real"])
            + " / "
            + "/".join(str(c) for c in entry["cached_tokens"]["sim"])
        )
        print(
            f"  {i:3d} {entry['class']:10s} {step['agent']:11s} {step['turn']:5d} "
            f"{real[0].prompt_tokens:7d}  {cached:>15s}{' *' if differ else '  '} "
            f"{_s(median_over(entry['ttft_s']['real']))} {_s(median_over(entry['ttft_s']['sim']))} "
            f"{_r(entry['ratio'])}   {_s(median_over(entry['server_ttft_s']['real']))} "
            f"{_s(median_over(entry['server_ttft_s']['sim']))} {_r(entry['server_ratio'])}"
            + (f"  errors: {entry['errors']}" if entry["errors"] else "")
        )
    compared = "cached tokens" if args.replies == "fixed" else "computed tokens (prompt - cached)"
    print(
        f"\nper class: median TTFT ratio sim/real [min-max] over its requests; requests whose "
        f"{compared} differ (* above)"
    )
    per_class = {}
    for klass in CLASSES:
        entries = [e for e in per_request if e["class"] == klass]
        if not entries:
            continue
        ratios = [e["ratio"] for e in entries if e["ratio"] is not None]
        server = [e["server_ratio"] for e in entries if e["server_ratio"] is not None]
        per_class[klass] = {
            "requests": len(entries),
            "hits_differ": sum(e["hits_differ"] for e in entries),
            "ratio": _stats(ratios),
            "server_ratio": _stats(server),
        }
        c = per_class[klass]
        print(
            f"  {klass:10s} n={len(entries):2d}  client {_stat_text(c['ratio'])}  "
            f"daemon {_stat_text(c['server_ratio'])}  hits differ: {c['hits_differ']}"
        )
    for run in runs:
        cache, engine = run.status.get("cache", {}), run.status.get("engine", {})
        print(
            f"  {run.engine} repeat {run.repeat + 1}: {run.seconds / 60:.1f} min, load "
            f"{run.load[0]:.2f} -> {run.load[1]:.2f}; cache {cache.get('entry_count')} "
            f"entries, {cache.get('bytes', 0) / 2**20:.0f} MiB, hit tokens "
            f"{cache.get('hit_tokens')} of {cache.get('queried_tokens')}, evictions "
            f"{cache.get('evictions')}; prefill tokens {engine.get('prefill_tokens_total')} "
            f"(next turns {engine.get('idle_tokens_total')}), generated "
            f"{engine.get('generated_tokens_total')}"
        )
    return {"requests": per_request, "classes": per_class}


def _stats(xs: list[float]) -> dict[str, float] | None:
    if not xs:
        return None
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def _stat_text(s: dict[str, float] | None) -> str:
    if s is None:
        return "-" * 20
    inside = "within 25%" if abs(s["median"] - 1) <= 0.25 else "OFF by >25%"
    return f"{s['median']:.2f} [{s['min']:.2f}-{s['max']:.2f}] {inside:11s}"


def _r(ratio: float | None) -> str:
    return "     -" if ratio is None else f"{ratio:6.2f}"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--developers", type=int, default=2, help="the trace's (2)")
    p.add_argument("--seed", type=int, default=0, help="the trace's (0)")
    p.add_argument("--trace", metavar="FILE", help="a trace file instead of generating one")
    p.add_argument("--sessions", type=int, default=5, help="the first N sessions by start (5)")
    p.add_argument("--steps", type=int, default=4, help="of each session, at most (4)")
    p.add_argument(
        "--context-tokens",
        type=int,
        default=22_528,
        help="the trace's and both daemons' --max-context (22528: the smallest the trace "
        "generator accepts fits Claude Code's 12.7k-token first request and compacts at 75%%)",
    )
    p.add_argument("--max-tokens", type=int, default=8, help="each request's output, at most (8)")
    p.add_argument("--block-size", type=int, default=128, help="both daemons' (128)")
    p.add_argument("--cache-memory-mb", type=int, default=4096, help="both daemons' (4096)")
    p.add_argument("--profile", default=PROFILE, help=f"the simulated engine's ({PROFILE})")
    p.add_argument("--repeats", type=int, default=1, help="runs of each engine (1)")
    p.add_argument("--replies", choices=("fixed", "engine"), default="fixed", help="(fixed)")
    p.add_argument("--text-cap", type=int, metavar="CHARS", help="cut longer texts (a quick run)")
    p.add_argument("--json", type=Path, metavar="FILE", help="everything measured, as JSON")
    args = p.parse_args()

    header, steps = trace_steps(args)
    klasses = classes(steps)
    print(f"CPU: {cpu_model()}, {os.cpu_count()} logical CPUs; load {os.getloadavg()[0]:.2f}")
    print(
        f"settings: profile {args.profile}; both daemons --block-size {args.block_size} "
        f"--cache-memory-mb {args.cache_memory_mb} --max-context {args.context_tokens}; "
        f"sim speed 1; replies {args.replies}; max tokens {args.max_tokens}, temperature 0; "
        f"text cap {args.text_cap or 'none'}; repeats {args.repeats}"
    )
    print(
        f"trace: {args.trace or f'generated, {args.developers} developers, seed {args.seed}'}; "
        f"{len(steps)} requests of {len({s['session'] for s in steps})} sessions: "
        + ", ".join(f"{k} {klasses.count(k)}" for k in CLASSES if k in klasses)
    )
    runs = []
    for repeat in range(args.repeats):
        # Alternating which engine goes first spreads a drift in the machine's load.
        for engine in ENGINES if repeat % 2 == 0 else ENGINES[::-1]:
            runs.append(run_engine(engine, repeat, header, steps, klasses, args))
    result = report(runs, steps, args)
    if args.json:
        result["settings"] = {
            k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
        }
        result["cpu"] = cpu_model()
        result["runs"] = [
            {
                **{k: v for k, v in asdict(r).items() if k != "rows"},
                "rows": [asdict(x) for x in r.rows],
            }
            for r in runs
        ]
        args.json.write_text(json.dumps(result, indent=2))
        print(f"\n-> {args.json}")


if __name__ == "__main__":
    main()
