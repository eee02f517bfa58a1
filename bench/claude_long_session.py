"""A long Claude Code session against `make run`'s fleet: turn after turn of `claude -p
... --continue`, each turn's prompt read from the cache, and Claude Code's auto-compaction
running before the daemons' context ends.

    .venv/bin/python bench/claude_long_session.py --agents ~/agents [--turns 30]
        [--router http://127.0.0.1:8000 --daemons http://127.0.0.1:8001,http://127.0.0.1:8002]
        [--json out.json]

Without --router it starts the fleet `make run` starts (`warmfleet up --nodes 2 --model
default --max-context 32768 --max-output-tokens 256`, without its example warm set) in a
temporary folder. Claude Code runs as the ready block of `warmfleet up` says, with the
compaction settings it prints for the served context (see `claude_code_compaction`), from
one HOME and project directory, with CLAUDE_CODE_MAX_OUTPUT_TOKENS=--max-output-tokens
(default 32: on a CPU SmolLM2 decodes a few tokens a second this far into a context and
seldom ends an answer, which Claude Code then continues up to three times, so short
answers keep a turn to about a minute; the turns stay mostly prefill, as in the e2e
suite). Each turn's
prompt is a question with a pasted log of about 1 KB (a developer pasting a failing run),
so the conversation outgrows the compaction threshold within the session. --home and
--project name the HOME and project directory (default: temporary ones); Claude Code's
system prompt names both, so a warm fleet serves its first request from the cache only
when they are the ones it saw before.

Per turn it prints: the requests the daemons served (Claude Code's and its compaction's)
and on which daemon, the prompt tokens they queried and the share read from the cache
(the daemons' prefix-cache counters), their mean time to first token (the daemons'
gen_ai.server.time_to_first_token histogram: sum over count), the turn's wall time,
whether Claude Code compacted (its `compact_boundary` event) and how the turn ended.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from harness import warmfleet
from harness.warmfleet import SERIES, scrape

from warmfleet_cli.up import claude_code_compaction

CONTEXT = 32768
MAX_OUTPUT = 256


@dataclass
class TurnFigures:
    turn: int
    requests: int
    daemons: list[str]
    queried_tokens: int
    hit_tokens: int
    cached_share: float
    mean_ttft_s: float
    wall_s: float
    compacted: bool
    ended: str

    def line(self) -> str:
        return (
            f"turn {self.turn:2d}: {self.requests} requests on {','.join(self.daemons) or '-'}, "
            f"{self.queried_tokens:6d} prompt tokens, {self.cached_share:6.1%} cached, "
            f"TTFT {self.mean_ttft_s:6.2f} s, {self.wall_s:6.1f} s"
            f"{', compacted' if self.compacted else ''}, {self.ended}"
        )


def prompt(rng: random.Random, turn: int) -> str:
    """A question with a pasted log of ~1 KB, different every turn."""
    services = ["api", "worker", "scheduler", "billing", "search", "auth"]
    lines = []
    for i in range(12):
        service = rng.choice(services)
        code = rng.choice([200, 200, 200, 404, 500, 503])
        lines.append(
            f"2026-12-03T10:{turn:02d}:{i:02d}Z {service} GET /v1/items/{rng.randrange(10**6)} "
            f"{code} {rng.randrange(5, 900)}ms"
        )
    log = "\n".join(lines)
    return f"Run {turn} failed. Here is its log:\n{log}\nWhich service failed most, in one line?"


def claude(
    bin_dir: Path, home: Path, cwd: Path, router: str, text: str, first: bool, max_output: int
) -> tuple[list[dict[str, Any]], int]:
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(home),
        "ANTHROPIC_BASE_URL": router,
        "ANTHROPIC_API_KEY": "unused",
        "ANTHROPIC_MODEL": "default",
        "ANTHROPIC_SMALL_FAST_MODEL": "default",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(max_output),
        **claude_code_compaction(CONTEXT, max_output),
    }
    args = [] if first else ["--continue"]
    done = subprocess.run(
        [str(bin_dir / "claude"), "-p", text, "--output-format", "stream-json", "--verbose", *args],
        env=env, cwd=cwd, capture_output=True, text=True, timeout=3600, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    events = [json.loads(x) for x in done.stdout.splitlines() if x.startswith("{")]
    return events, done.returncode


@contextmanager
def fleet(args: argparse.Namespace) -> Iterator[tuple[str, list[str]]]:
    if args.router:
        yield args.router, args.daemons.split(",")
        return
    options = ["--model", "default", "--max-context", str(CONTEXT)]
    options += ["--max-output-tokens", str(MAX_OUTPUT)]
    with tempfile.TemporaryDirectory() as folder, warmfleet.up(Path(folder), 2, *options) as up:
        yield up.url, up.daemons


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--agents", type=Path, required=True)
    p.add_argument("--turns", type=int, default=30)
    p.add_argument("--router")
    p.add_argument("--daemons", default="http://127.0.0.1:8001,http://127.0.0.1:8002")
    p.add_argument("--home", type=Path, help="Claude Code's HOME (default: a temporary one)")
    p.add_argument("--project", type=Path, help="its working directory (default: HOME/project)")
    p.add_argument("--max-output-tokens", type=int, default=32)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    bin_dir = args.agents / "node_modules" / ".bin"
    rng = random.Random(7)
    figures: list[TurnFigures] = []
    with tempfile.TemporaryDirectory() as tmp, fleet(args) as (router, daemons):
        home = args.home or Path(tmp) / "home"
        cwd = args.project or home / "project"
        if not cwd.exists():
            cwd.mkdir(parents=True)
            (cwd / "README.md").write_text("# runs\nA service whose runs fail now and then.\n")
        settings = claude_code_compaction(CONTEXT, args.max_output_tokens)
        print(f"Claude Code against {router}: {settings}", flush=True)
        for turn in range(1, args.turns + 1):
            before = {d: scrape([d]) for d in daemons}
            started = time.monotonic()
            events, code = claude(
                bin_dir, home, cwd, router, prompt(rng, turn), turn == 1, args.max_output_tokens
            )
            wall = time.monotonic() - started
            after = {d: scrape([d]) for d in daemons}
            delta = {d: {k: after[d][k] - before[d][k] for k in SERIES} for d in daemons}
            served = [d for d in daemons if delta[d]["ttft_count"] > 0]
            total = {k: sum(delta[d][k] for d in daemons) for k in SERIES}
            (result,) = [e for e in events if e["type"] == "result"] or [{}]
            compacted = any(e.get("subtype") == "compact_boundary" for e in events)
            figures.append(
                TurnFigures(
                    turn=turn,
                    requests=int(total["ttft_count"]),
                    daemons=[d.rsplit(":", 1)[-1] for d in served],
                    queried_tokens=int(total["queried"]),
                    hit_tokens=int(total["hits"]),
                    cached_share=total["hits"] / total["queried"] if total["queried"] else 0.0,
                    mean_ttft_s=total["ttft_sum"] / max(total["ttft_count"], 1),
                    wall_s=wall,
                    compacted=compacted,
                    ended=f"exit {code} {result.get('subtype', '')} "
                    f"{result.get('api_error') or ''}".strip(),
                )
            )
            print(figures[-1].line(), flush=True)
            if args.json:  # after every turn: a long run stopped early keeps its figures
                args.json.write_text(json.dumps([asdict(f) for f in figures], indent=2))
    later = figures[1:]
    if later:
        shares = [f.cached_share for f in later]
        ttfts = [f.mean_ttft_s for f in later]
        print(
            f"turns 2-{len(figures)}: cached share median {statistics.median(shares):.1%} "
            f"(min {min(shares):.1%}), TTFT median {statistics.median(ttfts):.2f} s "
            f"({min(ttfts):.2f}-{max(ttfts):.2f}), compactions {sum(f.compacted for f in figures)}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
