"""What keying an agent's turn costs (`LayoutKeyer.chat`: render, tokenize, find the cuts,
plan the blocks: what the router and every daemon do to each request), with a message's
probes from one render (`warmfleet_common.verbatim`, where the template inserts contents
as they are) and with one render per probe (before it), and through the router's session
memo (`warmfleet_router.turn_memo`: the turn keyed as the continuation of the session's
last request), on the embedded model's tokenizer and template.

An agent's conversation grows turn by turn (a 1.2k-word system prompt, 12 tools, then a
250-word answer and an 80-word question a turn); each turn is keyed as the next request
of the conversation by a keyer that has keyed the earlier ones (its memos warm, as in a
router). Thread CPU per request at a few sizes, medians over `--runs` conversations (a
fresh keyer each), the ways one after the other in each run.

Then the router's whole prepare stage (`prepare.prepare`: parse, check, key) on the
bodies `bench/router_fleet.py` sends (Claude Code and Codex as the CLIs send them, with
their session headers: `warmfleet sim trace`), the first `--turns` steps of `--sessions`
sessions, each request prepared with the session memo and without it (a memo of no
sessions), alternately; the job's own thread CPU, as the router's metric counts it.

    .venv/bin/python bench/prompt_probes.py [--runs 3] [--turns 40] [--sessions 40]
        [--steps 6]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from typing import Any

from warmfleet_cli.sim import trace as traces
from warmfleet_cli.sim.bodies import BodyOptions, SessionBodies
from warmfleet_common.cache_layout import CacheLayout, export_layout
from warmfleet_common.chunking import root_key
from warmfleet_daemon.models.loader import load_gguf_tokenizer_only
from warmfleet_router.keys import LayoutKeyer, RequestBlocks
from warmfleet_router.prepare import Job, KeyerCache, Prepared, prepare
from warmfleet_router.sessions import SessionKeys
from warmfleet_router.turn_memo import TurnMemo

WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "that",
    "for",
    "it",
    "with",
    "as",
    "on",
    "was",
    "by",
    "this",
    "be",
    "are",
    "at",
    "from",
    "def",
    "return",
    "self",
    "import",
    "class",
    "if",
    "else",
    "while",
    "try",
    "except",
    "raise",
    "yield",
    "async",
    "await",
    "lambda",
]


def conversation(seed: int, turns: int) -> tuple[list[dict[str, Any]], list[list[dict[str, Any]]]]:
    rng = random.Random(seed)

    def text(n: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(n))

    tools = [
        {
            "type": "function",
            "function": {
                "name": f"tool_{i}",
                "description": text(60),
                "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
            },
        }
        for i in range(12)
    ]
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": text(1200)},
        {"role": "user", "content": text(80)},
    ]
    requests = []
    for _ in range(turns):
        messages += [
            {"role": "assistant", "content": text(250)},
            {"role": "user", "content": text(80)},
        ]
        requests.append(list(messages))
    return tools, requests


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--turns", type=int, default=40)
    p.add_argument("--sessions", type=int, default=40, help="agent sessions prepared")
    p.add_argument("--steps", type=int, default=6, help="first steps of each session")
    args = p.parse_args()
    tokenizer = load_gguf_tokenizer_only()
    layout = export_layout(tokenizer, model="m", root=root_key("m"), block_size=128)
    conversations(layout, args)
    prepare_stage(layout, args)


WAYS = ("one render per probe", "one render", "session memo")


def conversations(layout: CacheLayout, args: argparse.Namespace) -> None:
    measured = [args.turns * k // 4 - 1 for k in (1, 2, 3, 4)]
    found: dict[str, dict[int, list[float]]] = {way: {} for way in WAYS}
    tokens: dict[int, int] = {}
    for run in range(args.runs):
        for way in WAYS:
            keyer = LayoutKeyer(layout)
            memo = TurnMemo()
            if way == "one render per probe":
                keyer._prompts._inserts_verbatim = lambda *_: False  # type: ignore[method-assign]
            tools, requests = conversation(run, args.turns)
            for turn, messages in enumerate(requests):
                started = time.thread_time()
                if way == "session memo":
                    blocks = memo.chat(keyer, "session", messages, tools)
                else:
                    blocks = keyer.chat(messages, tools)
                spent = time.thread_time() - started
                if turn in measured:
                    found[way].setdefault(turn, []).append(spent * 1e3)
                    tokens[turn] = blocks.tokens
    print(f"{args.runs} conversations; thread CPU per request, ms: median (range)")
    print("| request's tokens | one render per probe | one render | session memo | ratio |")
    print("|---|---|---|---|---|")
    for turn in measured:
        old, new, memo_ms = (found[way][turn] for way in WAYS)
        ratio = statistics.median(new) / statistics.median(memo_ms)
        print(
            f"| {tokens[turn]:,} | {figure(old)} | {figure(new)} | {figure(memo_ms)} "
            f"| {ratio:.1f}x |"
        )


class Whole(TurnMemo):
    """No session memo: each request keyed whole, as before it (`LayoutKeyer.chat`)."""

    def chat(self, keyer: LayoutKeyer, session: str, *args: Any, **kwargs: Any) -> RequestBlocks:
        return keyer.chat(*args, **kwargs)


def prepare_stage(layout: CacheLayout, args: argparse.Namespace) -> None:
    params = traces.TraceParams(
        developers=max(20, args.sessions // 3), upgrades=(), node_lost=None, nodes_added=None,
        rolling_restart=None,
    )  # fmt: skip
    trace = traces.generate(params)
    sessions = [s for s in traces.sessions(trace.records).values() if s[0]["turn"] == 0]
    options, keys = BodyOptions.of(trace.header), SessionKeys()
    jobs: list[tuple[str, Job]] = []
    for steps in (s[: args.steps] for s in sessions[: args.sessions]):
        bodies = SessionBodies(options)
        for step in steps:
            request = bodies.request(step)
            route = "messages" if request.path.startswith("/v1/messages") else "responses"
            headers = {k.lower(): v for k, v in request.headers.items()}
            raw = json.dumps(request.body).encode()
            job = Job(route, raw, (layout.fingerprint,), keys.body_paths,
                      session=keys.of(headers))  # fmt: skip
            jobs.append(("first" if step["turn"] == 0 else "later", job))
    medians: dict[tuple[str, bool], list[float]] = {}
    tokens: dict[str, list[int]] = {"first": [], "later": []}
    for _ in range(args.runs):
        with_memo, whole = KeyerCache(None), KeyerCache(None)
        whole.turns = Whole()
        for cache in (with_memo, whole):
            cache.add(layout)
        spent: dict[tuple[str, bool], list[float]] = {}
        for which, job in jobs:
            for memo, cache in ((True, with_memo), (False, whole)):
                prepared = prepare(job, cache)
                assert isinstance(prepared, Prepared)
                spent.setdefault((which, memo), []).append(prepared.cpu_seconds * 1e3)
            tokens[which].append(prepared.blocks[layout.fingerprint].tokens)
        for key, values in spent.items():
            medians.setdefault(key, []).append(statistics.median(values))
    print(
        f"\nprepare on agent bodies ({args.sessions} sessions, first {args.steps} steps), "
        f"{args.runs} runs: thread CPU per request, ms: median of the runs' medians (range)"
    )
    print("| requests | count | tokens (median) | keyed whole | session memo | ratio |")
    print("|---|---|---|---|---|---|")
    for which in ("first", "later"):
        whole_ms, memo_ms = medians[which, False], medians[which, True]
        ratio = statistics.median(whole_ms) / statistics.median(memo_ms)
        count = len(tokens[which]) // args.runs
        print(
            f"| {which} turns | {count} | {statistics.median(tokens[which]):,.0f} "
            f"| {figure(whole_ms, 2)} | {figure(memo_ms, 2)} | {ratio:.1f}x |"
        )
    memo = with_memo.turns
    print(f"memo (last run): {memo.continued} continued, {memo.whole} keyed whole, "
          f"{len(memo)} sessions, {memo.size_bytes / 2**20:.1f} MiB")  # fmt: skip


def figure(values: list[float], digits: int = 1) -> str:
    low, mid, high = min(values), statistics.median(values), max(values)
    return f"{mid:.{digits}f} ({low:.{digits}f}-{high:.{digits}f})"


if __name__ == "__main__":
    main()
