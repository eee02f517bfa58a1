"""Continuous batching: join/leave, chunked prefill interleaved with decoding,
shortest-remaining-prefill first, dedup of shared chunks, cancellation."""

from __future__ import annotations

import dataclasses
import random

import pytest

from support.engine import greedy, request, run, tokens_of
from warmfleet_daemon.engine.core import Engine
from warmfleet_daemon.engine.requests import EngineConfig, Event
from warmfleet_daemon.models.tiny import tiny_random_model

VOCAB = (100, 49000)


def prompt(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(*VOCAB) for _ in range(n)]


def test_concurrent_requests_each_get_their_solo_output(tiny, make_engine) -> None:
    rng = random.Random(1)
    prompts = [prompt(rng, n) for n in (5, 40, 90, 200, 13, 64)]
    solo = [tokens_of(run(make_engine(tiny), request(p, sampling=greedy(20)))[0]) for p in prompts]
    together = run(make_engine(tiny), *[request(p, sampling=greedy(20)) for p in prompts])
    assert [tokens_of(e) for e in together] == solo
    assert len({tuple(s) for s in solo}) == len(solo)  # the outputs really differ


def test_a_long_prefill_does_not_stall_running_decodes(tiny, make_engine) -> None:
    rng = random.Random(2)
    engine = make_engine(tiny, block_size=16)
    short_events: list[Event] = []
    engine.submit(request(prompt(rng, 8), sampling=greedy(30)), short_events.append)
    while not engine.stats().running:
        engine.step()
    long_events: list[Event] = []
    engine.submit(request(prompt(rng, 400), sampling=greedy(5)), long_events.append)
    engine.step()
    for _ in range(10):  # every step decodes one token while one chunk is prefilled
        before = len(tokens_of(short_events))
        engine.step()
        assert len(tokens_of(short_events)) == before + 1 or short_events[-1].finish_reason
        assert engine.stats().prefilling == 1
    engine.run_until_idle()
    assert long_events[-1].finish_reason == "length"


def test_short_prompts_are_prefilled_before_long_ones(tiny, make_engine) -> None:
    rng = random.Random(3)
    engine = make_engine(tiny, block_size=16)
    order: list[str] = []
    long_req = request(prompt(rng, 600), sampling=greedy(2))
    short_req = request(prompt(rng, 20), sampling=greedy(2))
    engine.submit(long_req, lambda e: e.finish_reason and order.append("long"))
    engine.step()  # the long prompt starts first
    engine.submit(short_req, lambda e: e.finish_reason and order.append("short"))
    engine.run_until_idle()
    assert order == ["short", "long"]


def test_two_prompts_sharing_a_prefix_compute_it_once(tiny, make_engine) -> None:
    rng = random.Random(4)
    shared = prompt(rng, 256)
    a, b = shared + prompt(rng, 10), shared + prompt(rng, 12)
    engine = make_engine(tiny, block_size=32)
    events = run(engine, request(a, (256,)), request(b, (256,)))
    total_prefill = engine.stats().prefill_tokens_total
    assert total_prefill == 256 + (len(a) - 256) + (len(b) - 256)
    assert sorted(e[-1].usage.cached_tokens for e in events) == [0, 256]


def test_max_num_seqs_queues_the_rest(tiny, make_engine) -> None:
    rng = random.Random(5)
    engine = make_engine(tiny, max_num_seqs=2)
    for _ in range(5):
        engine.submit(request(prompt(rng, 30), sampling=greedy(4)), lambda _: None)
    engine.step()
    stats = engine.stats()
    assert stats.running + stats.prefilling == 2 and stats.waiting == 3
    engine.run_until_idle()
    assert engine.stats().waiting == 0


def test_cancel_frees_the_slot_and_ends_the_stream(tiny, make_engine) -> None:
    rng = random.Random(6)
    engine = make_engine(tiny)
    events: list[Event] = []
    req = request(prompt(rng, 30), sampling=greedy(1000, ignore_eos=True))
    engine.submit(req, events.append)
    for _ in range(5):
        engine.step()
    engine.cancel(req.request_id)
    engine.step()
    assert events[-1].finish_reason == "abort"
    assert engine.stats().running == 0


def test_single_token_prompt(tiny, make_engine) -> None:
    events = run(make_engine(tiny), request([1234], sampling=greedy(3)))[0]
    assert len(tokens_of(events)) == 3 and events[-1].usage.cached_tokens == 0


def test_a_request_arriving_during_warm_up_does_not_pay_for_the_prefix_twice(
    tiny, make_engine
) -> None:
    rng = random.Random(8)
    prefix = prompt(rng, 300)
    real = prefix + prompt(rng, 20)
    engine = make_engine(tiny, block_size=32)
    events = run(engine, request(prefix, prefill_only=True), request(real, (300,)))
    assert engine.stats().prefill_tokens_total == len(real)
    assert events[1][-1].usage.cached_tokens == 300


def test_one_request_holds_half_the_slots_and_its_choices_stay_what_they_are_alone(
    tiny, make_engine
) -> None:
    from warmfleet_daemon.api.generation import copies
    from warmfleet_daemon.engine.sampling import SamplingParams

    rng = random.Random(8)
    tokens = prompt(rng, 40)
    for sampling in (greedy(24, ignore_eos=True), SamplingParams(24, 1.0, seed=7, ignore_eos=True)):
        engine = make_engine(tiny, max_num_seqs=16)
        choices = copies(request(tokens, sampling=sampling), 16)
        events: list[list[Event]] = [[] for _ in choices]
        for choice, sink in zip(choices, events):
            engine.submit(choice, sink.append)
        engine.step()
        stats = engine.stats()
        assert (stats.prefilling + stats.running, stats.waiting) == (8, 8)
        other: list[Event] = []
        engine.submit(request(prompt(rng, 20), sampling=greedy(1)), other.append)
        while not (other and other[-1].finish_reason):
            engine.step()
        assert not any(e[-1].finish_reason for e in events if e)  # it did not wait for them
        engine.run_until_idle()
        # Each choice is what it would be alone: choice i of a seeded request as seed + i.
        for i, got in enumerate(events):
            alone = request(tokens, sampling=choices[i].sampling)
            assert tokens_of(got) == tokens_of(run(make_engine(tiny), alone)[0]), i
        assert len({tuple(tokens_of(e)) for e in events}) == (1 if sampling.greedy else 16)


# SmolLM2-135M's widths (2 of its 30 layers): at the tiny models' widths OpenBLAS's
# results never depend on the rows beside them, at these they do past 12 rows.
REAL_WIDTHS = dict(
    hidden_size=576,
    intermediate_size=1536,
    num_attention_heads=9,
    num_key_value_heads=3,
    head_dim=64,
    num_hidden_layers=2,
)


@pytest.mark.parametrize(
    ("arch", "kv_bits", "path"),
    [
        ("qwen3", None, "batched rows, mlx-lm forward"),
        ("llama", 8, "mlx-lm forward, attention per sequence"),
    ],
)
def test_sixteen_sequences_decoding_together_each_get_their_solo_logprobs(
    tiny, arch: str, kv_bits: int | None, path: str
) -> None:
    """mlx-lm's forward runs x @ W^T, for which OpenBLAS gives a row a different result
    with more than 12 rows beside it; the engine takes such steps in row groups, so a
    response (bitwise: its logprobs) never depends on what it was batched with."""
    weights = tiny_random_model(vocab_size=tiny.model.args.vocab_size, arch=arch, **REAL_WIDTHS)
    loaded = dataclasses.replace(tiny, model=weights)
    engine = Engine(loaded, EngineConfig(32, 1 << 30, 16, kv_bits=kv_bits))
    assert engine.decode_path == path
    rng = random.Random(3)
    prompts = [prompt(rng, 5 + i) for i in range(16)]  # all 16 decoding at once

    def logprobs(events: list[Event]) -> list[tuple[int, float]]:
        return [(lp.token, lp.logprob) for e in events for lp in e.logprobs]

    sampling = greedy(24, logprobs=0, ignore_eos=True)
    alone = [logprobs(run(engine, request(p, sampling=sampling))[0]) for p in prompts]
    engine.clear_prefix_cache()
    together = run(engine, *[request(p, sampling=sampling) for p in prompts])
    assert [logprobs(t) for t in together] == alone
