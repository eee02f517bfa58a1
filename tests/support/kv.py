"""Prompts and checks shared by the warm-without-prefill tests."""

from __future__ import annotations

import random

from support.engine import request, run, tokens_of
from warmfleet_common.prompts import RenderedPrompt
from warmfleet_daemon.engine.core import Engine

VOCAB = (100, 49000)
BLOCK = 16


def prompts(seed: int = 5) -> tuple[RenderedPrompt, RenderedPrompt]:
    """A warm prefix (ends at a cut, like warm-up's) and a request that continues it."""
    rng = random.Random(seed)
    prefix = [rng.randrange(*VOCAB) for _ in range(90)]
    question = [rng.randrange(*VOCAB) for _ in range(12)]
    return RenderedPrompt(tuple(prefix), (40,)), RenderedPrompt(
        tuple(prefix + question), (40, len(prefix))
    )


def from_scratch(engine: Engine, prompt: RenderedPrompt) -> list[int]:
    engine.clear_prefix_cache()
    out = tokens_of(run(engine, request(prompt.tokens, prompt.cuts))[0])
    engine.clear_prefix_cache()
    return out


def answer(engine: Engine, prompt: RenderedPrompt) -> tuple[list[int], int]:
    events = run(engine, request(prompt.tokens, prompt.cuts))[0]
    assert events[-1].usage is not None
    return tokens_of(events), events[-1].usage.cached_tokens
