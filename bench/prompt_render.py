"""What a daemon spends turning an agent's request into its prompt (rendering with the
chat template, tokenizing, finding the cuts), before any prefill: a fresh daemon's
first such request, and the same request again. Prints medians over fresh builders.

A request is a JSON file holding an Anthropic Messages body, a Responses body, or a
recording of one (`{"path": ..., "body": ...}`: e.g. Claude Code's first request as a
recording endpoint saw it). The embedded model's tokenizer and template (no weights).

    .venv/bin/python bench/prompt_render.py REQUEST.json [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("request", type=Path)
    p.add_argument("--runs", type=int, default=5)
    args = p.parse_args()

    from warmfleet_common.prompts import PromptBuilder
    from warmfleet_daemon.models.loader import load_gguf_tokenizer_only
    from warmfleet_router.routes import BY_NAME

    document: Any = json.loads(args.request.read_text())
    body = document.get("body", document) if isinstance(document, dict) else document
    if isinstance(body, str):
        body = json.loads(body)
    route = BY_NAME["responses" if "input" in body else "messages"]
    prompt = route.prompt_of(body)
    tokenizer = load_gguf_tokenizer_only()
    first: list[float] = []
    again: list[float] = []
    tokens = 0
    for _ in range(args.runs):
        builder = PromptBuilder(tokenizer)  # a fresh daemon: nothing memoized yet
        began = time.perf_counter()
        rendered = builder.chat(
            prompt.messages, prompt.tools, template_kwargs=prompt.template_kwargs
        )
        first.append(time.perf_counter() - began)
        began = time.perf_counter()
        builder.chat(prompt.messages, prompt.tools, template_kwargs=prompt.template_kwargs)
        again.append(time.perf_counter() - began)
        tokens = len(rendered.tokens)

    def figure(values: list[float]) -> str:
        return f"{statistics.median(values):.3f} s ({min(values):.3f}-{max(values):.3f})"

    print(f"{args.request.name}: {len(json.dumps(body))} bytes, {tokens} tokens, {args.runs} runs")
    print(f"  first request of a fresh daemon: {figure(first)}")
    print(f"  the same request again:          {figure(again)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
