"""What keying an agent's turn costs (`LayoutKeyer.chat`: render, tokenize, find the cuts,
plan the blocks: what the router and every daemon do to each request), with a message's
probes from one render (`warmfleet_common.verbatim`, where the template inserts contents
as they are) and with one render per probe (before it), on the embedded model's
tokenizer and template.

An agent's conversation grows turn by turn (a 1.2k-word system prompt, 12 tools, then a
250-word answer and an 80-word question a turn); each turn is keyed as the next request
of the conversation by a keyer that has keyed the earlier ones (its memos warm, as in a
router). Thread CPU per request at a few sizes, medians over `--runs` conversations (a
fresh keyer each), the two ways interleaved.

    .venv/bin/python bench/prompt_probes.py [--runs 3] [--turns 40]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from typing import Any

from warmfleet_common.cache_layout import export_layout
from warmfleet_common.chunking import root_key
from warmfleet_daemon.models.loader import load_gguf_tokenizer_only
from warmfleet_router.keys import LayoutKeyer

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
    args = p.parse_args()
    tokenizer = load_gguf_tokenizer_only()
    layout = export_layout(tokenizer, model="m", root=root_key("m"), block_size=128)
    measured = [args.turns * k // 4 - 1 for k in (1, 2, 3, 4)]
    found: dict[str, dict[int, list[float]]] = {"one render": {}, "one render per probe": {}}
    tokens: dict[int, int] = {}
    for run in range(args.runs):
        for way in found:
            keyer = LayoutKeyer(layout)
            if way == "one render per probe":
                keyer._prompts._inserts_verbatim = lambda *_: False  # type: ignore[method-assign]
            tools, requests = conversation(run, args.turns)
            for turn, messages in enumerate(requests):
                started = time.thread_time()
                blocks = keyer.chat(messages, tools)
                spent = time.thread_time() - started
                if turn in measured:
                    found[way].setdefault(turn, []).append(spent * 1e3)
                    tokens[turn] = blocks.tokens
    print(f"{args.runs} conversations; thread CPU per request, ms: median (range)")
    print("| request's tokens | one render per probe | one render | ratio |")
    print("|---|---|---|---|")
    for turn in measured:
        old, new = found["one render per probe"][turn], found["one render"][turn]
        ratio = statistics.median(old) / statistics.median(new)
        print(f"| {tokens[turn]:,} | {figure(old)} | {figure(new)} | {ratio:.1f}x |")


def figure(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"


if __name__ == "__main__":
    main()
