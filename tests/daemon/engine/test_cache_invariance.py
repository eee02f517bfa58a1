"""The central invariant: a response served from the prefix cache is token for token
the response computed without it (greedy), and the KV it decodes from is bitwise the
same. Property-based on the tiny model; a few cases on the embedded model."""

from __future__ import annotations

import random

import mlx.core as mx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support.engine import greedy, model, request, run, tokens_of
from warmfleet_daemon.engine.core import Engine

VOCAB = (100, 49000)
HYPOTHESIS = settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def cold(engine: Engine, tokens: list[int], cuts: tuple[int, ...]) -> list[int]:
    engine.clear_prefix_cache()
    out = tokens_of(run(engine, request(tokens, cuts))[0])
    engine.clear_prefix_cache()
    return out


@HYPOTHESIS
@given(
    data=st.data(),
    length=st.integers(3, 300),
    block=st.sampled_from([8, 16, 32]),
    kind=st.sampled_from(["full", "partial-at-cut", "partial-no-cut", "strict-prefix"]),
)
def test_greedy_output_with_a_cache_hit_equals_the_cold_output(
    tiny, make_engine, data, length, block, kind
) -> None:
    rng = random.Random(data.draw(st.integers(0, 2**32)))
    tokens = [rng.randrange(*VOCAB) for _ in range(length)]
    split = data.draw(st.integers(1, length - 2))
    cuts = (split,) if kind != "partial-no-cut" else ()
    engine = make_engine(tiny, block_size=block)
    expected = cold(engine, tokens, cuts)

    if kind == "full":  # an exact repeat: even the first token's logits are cached
        run(engine, request(tokens, cuts))
        want_cached = length
    elif kind == "strict-prefix":  # what warm-up stores: exactly the shared prefix
        run(engine, request(tokens[:split], prefill_only=True))
        want_cached = split
    else:
        other = tokens[:split] + [rng.randrange(*VOCAB) for _ in range(rng.randrange(1, 50))]
        run(engine, request(other, cuts))
        want_cached = split if kind == "partial-at-cut" else (split // block) * block

    events = run(engine, request(tokens, cuts))[0]
    assert tokens_of(events) == expected
    assert events[-1].usage is not None
    assert events[-1].usage.cached_tokens == want_cached


def prefill_kv(engine: Engine, tokens: list[int], cuts: tuple[int, ...]) -> list[mx.array]:
    """The KV arrays a request decodes from (engine internals: prefill only)."""
    engine.submit(request(tokens, cuts), lambda _: None)
    engine._take_inbox()
    seq = engine.scheduler.prefilling[-1]
    while seq in engine.scheduler.prefilling:
        engine._prefill_step(seq)
    if seq.caches is not None:
        arrays = [
            a
            for c in seq.caches
            for a in (c.keys[..., : c.offset, :], c.values[..., : c.offset, :])
        ]
    else:  # admitted to the decode batch: its KV is that row's
        assert engine.decoder.rows is not None
        row = engine.decoder.decoding.index(seq)
        arrays = [a for kv in engine.decoder.rows.row_kv(row) for a in kv]
    engine.cancel(seq.request.request_id)
    engine.run_until_idle()
    return arrays


@pytest.mark.parametrize("spec", ["tiny-random", "default"])
def test_kv_after_a_cache_hit_is_bitwise_the_cold_kv(spec, make_engine) -> None:
    loaded = model(spec)
    rng = random.Random(7)
    engine = make_engine(loaded, block_size=128)
    for length, split in [(300, 140), (420, 96), (200, 199)]:
        tokens = [rng.randrange(*VOCAB) for _ in range(length)]
        engine.clear_prefix_cache()
        expected = prefill_kv(engine, tokens, (split,))
        engine.clear_prefix_cache()
        run(engine, request(tokens[:split], prefill_only=True))
        got = prefill_kv(engine, tokens, (split,))
        assert all(mx.array_equal(a, b).item() for a, b in zip(expected, got))


@pytest.mark.parametrize("spec", ["tiny-random-lfm2", "tiny-random-gemma3"])
def test_caches_that_cannot_be_trimmed_resume_from_block_snapshots(spec, make_engine) -> None:
    loaded = model(spec)
    rng = random.Random(3)
    engine = make_engine(loaded, block_size=16)
    assert not engine.stats().batched_decode
    tokens = [rng.randrange(*VOCAB) for _ in range(150)]
    split = 70
    expected = cold(engine, tokens, (split,))
    run(engine, request(tokens[:split], prefill_only=True))
    events = run(engine, request(tokens, (split,)))[0]
    assert tokens_of(events) == expected
    assert events[-1].usage.cached_tokens == split
    # a prompt that diverges inside a block resumes from the block boundary before it
    other = tokens[:75] + [rng.randrange(*VOCAB) for _ in range(30)]  # no cuts: 16, 32, ...
    engine.clear_prefix_cache()
    want = cold(engine, other, ())
    run(engine, request(tokens, ()))
    events = run(engine, request(other, ()))[0]
    assert tokens_of(events) == want
    assert events[-1].usage.cached_tokens == 64


def test_embedded_model_chat_with_a_warm_system_prompt_matches_cold(embedded, make_engine) -> None:
    from warmfleet_common.prompts import PromptBuilder

    prompts = PromptBuilder(embedded.tokenizer)
    system = {"role": "system", "content": "You are a terse assistant for a Kubernetes team. " * 12}
    question = {"role": "user", "content": "What does a readiness probe do?"}
    rendered = prompts.chat([system, question])
    engine = make_engine(embedded, block_size=128)
    expected = run(engine, request(rendered.tokens, rendered.cuts, sampling=greedy(20)))[0]
    engine.clear_prefix_cache()
    warm = prompts.shared_prefix([system])
    run(engine, request(warm.tokens, warm.cuts, prefill_only=True))
    events = run(engine, request(rendered.tokens, rendered.cuts, sampling=greedy(20)))[0]
    assert tokens_of(events) == tokens_of(expected)
    assert events[-1].usage.cached_tokens == len(warm.tokens)
