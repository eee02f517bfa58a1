"""Sampling parameters and stop conditions."""

from __future__ import annotations

import random

from support.engine import greedy, request, run, tokens_of
from warmfleet_daemon.engine.sampling import SamplingParams

VOCAB = (100, 49000)
PROMPT = [random.Random(0).randrange(*VOCAB) for _ in range(40)]


def sample(engine, **kw: object) -> list[int]:
    params = SamplingParams(**{"max_tokens": 16, **kw})  # type: ignore[arg-type]
    return tokens_of(run(engine, request(PROMPT, sampling=params))[0])


def test_seed_makes_sampling_reproducible(tiny, make_engine) -> None:
    engine = make_engine(tiny)
    a = sample(engine, temperature=1.0, seed=42)
    assert sample(engine, temperature=1.0, seed=42) == a
    assert sample(engine, temperature=1.0, seed=43) != a


def test_seeded_streams_do_not_disturb_each_other_in_a_batch(tiny, make_engine) -> None:
    alone = sample(make_engine(tiny), temperature=1.0, seed=7)
    engine = make_engine(tiny)
    params = SamplingParams(max_tokens=16, temperature=1.0, seed=7)
    other = SamplingParams(max_tokens=16, temperature=1.3, seed=99)
    together = run(engine, request(PROMPT, sampling=params), request(PROMPT[:20], sampling=other))
    assert tokens_of(together[0]) == alone


def test_temperature_zero_and_a_tiny_top_p_are_greedy(tiny, make_engine) -> None:
    engine = make_engine(tiny)
    g = sample(engine, temperature=0.0)
    assert sample(engine, temperature=0.8, top_p=1e-9, seed=1) == g


def test_max_tokens_ends_with_length(tiny, make_engine) -> None:
    events = run(make_engine(tiny), request(PROMPT, sampling=greedy(5, ignore_eos=True)))[0]
    assert len(tokens_of(events)) == 5 and events[-1].finish_reason == "length"
    assert events[-1].usage.completion_tokens == 5


def test_stop_string_ends_the_output_before_it(tiny, make_engine) -> None:
    engine = make_engine(tiny)
    full = "".join(e.text for e in run(engine, request(PROMPT, sampling=greedy(16)))[0])
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    events = run(engine, request(PROMPT, sampling=greedy(16, stop=(stop,))))[0]
    text = "".join(e.text for e in events)
    assert events[-1].finish_reason == "stop"
    assert text == full[: full.index(stop)]


def test_eos_ends_with_stop_and_is_not_in_the_text(embedded, make_engine) -> None:
    from warmfleet_common.prompts import PromptBuilder

    rendered = PromptBuilder(embedded.tokenizer).chat(
        [{"role": "user", "content": "What is the capital of France?"}]
    )
    events = run(
        make_engine(embedded, block_size=128), request(rendered.tokens, sampling=greedy(40))
    )[0]
    text = "".join(e.text for e in events)
    assert events[-1].finish_reason == "stop"
    assert "Paris" in text and "<|im_end|>" not in text
    assert tokens_of(events)[-1] in embedded.tokenizer.eos_token_ids
