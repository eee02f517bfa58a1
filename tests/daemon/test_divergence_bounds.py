"""The divergence analysis stays linear in the prompts' tokens (the daemon runs it live
on whatever clients send): prompts that differ after a few tokens and go on to
different content for thousands of tokens, the case that made it quadratic."""

from __future__ import annotations

import random
from collections.abc import Sequence

from warmfleet_daemon.divergence import PromptTokens, analyze


class CountingDecode:
    def __init__(self) -> None:
        self.tokens = 0

    def __call__(self, tokens: Sequence[int]) -> str:
        self.tokens += len(tokens)
        return "".join(f"w{t} " for t in tokens)


def diverging_prompts(length: int, count: int = 3) -> list[PromptTokens]:
    rng = random.Random(length)
    shared = [1, 2, 3, 4, 5]
    return [
        PromptTokens(tuple(shared + [rng.randrange(100, 5000) for _ in range(length)]), None)
        for _ in range(count)
    ]


def decoded_tokens(length: int) -> int:
    decode = CountingDecode()
    report = analyze(diverging_prompts(length), decode, prefix_tokens=length + 5)
    assert report.diffed == 2 and report.points
    return decode.tokens


def test_decoding_work_grows_linearly_with_prompt_length() -> None:
    small, large = decoded_tokens(1000), decoded_tokens(4000)
    assert large < 40 * 4000  # a few passes over the tokens, not one per token
    assert large < 6 * small  # 4x the tokens: about 4x the work, not 16x


def test_the_time_budget_stops_diffing_and_scales_the_counts() -> None:
    prompts = diverging_prompts(200, count=20)
    everything = analyze(prompts, CountingDecode(), prefix_tokens=205)
    budgeted = analyze(prompts, CountingDecode(), prefix_tokens=205, time_budget_s=0.0)
    assert everything.diffed == 19 and budgeted.diffed == 1
    assert budgeted.new_prompts == everything.new_prompts == 19  # scaled up from 1
