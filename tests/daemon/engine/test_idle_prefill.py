"""Idle-priority prefills (the next turn's prefix): they never hold a real request up by
more than one chunk, they are computed as any prefill is (a request that continues
them gets the cold output), and the prompt builder finds the next turn's prefix with
the cuts of the request that will come."""

from __future__ import annotations

import random

from support.engine import greedy, request, run, tokens_of
from warmfleet_common.prompts import PromptBuilder
from warmfleet_daemon.engine.requests import Event, GenerationRequest

VOCAB = (100, 49000)


def idle(tokens: list[int], cuts: tuple[int, ...] = ()) -> GenerationRequest:
    return request(tokens, cuts, prefill_only=True, idle=True)


def test_no_idle_chunk_runs_while_a_real_request_prefills_or_decodes(tiny, make_engine) -> None:
    rng = random.Random(1)
    engine = make_engine(tiny, block_size=8)
    done: list[Event] = []
    engine.submit(idle([rng.randrange(*VOCAB) for _ in range(160)]), done.append)
    engine.step()
    assert engine.stats().idle_tokens_total == 8  # one chunk per step with nothing else to do

    real: list[Event] = []
    engine.submit(request([rng.randrange(*VOCAB) for _ in range(60)]), real.append)
    steps = 0
    while not (real and real[-1].finish_reason):
        engine.step()
        steps += 1
        # Every step from the real request's arrival to its end is the real request's.
        assert engine.stats().idle_tokens_total == 8
    assert steps > 8  # it prefilled (8 chunks) and decoded meanwhile
    assert real[-1].finish_reason == "length" and not done

    engine.run_until_idle()
    assert done[-1].finish_reason == "prefilled"
    stats = engine.stats()
    assert stats.idle_tokens_total == 160 and stats.idle_waiting == 0
    assert stats.requests_total == 1  # idle work is not a request


def test_a_request_that_continues_an_idle_prefix_gets_the_cold_output(tiny, make_engine) -> None:
    rng = random.Random(2)
    tokens = [rng.randrange(*VOCAB) for _ in range(90)]
    cuts = (20, 61)
    engine = make_engine(tiny, block_size=16)
    cold = tokens_of(run(engine, request(tokens, cuts, sampling=greedy(16)))[0])
    engine.clear_prefix_cache()

    run(engine, idle(tokens[:61], (20,)))
    events = run(engine, request(tokens, cuts, sampling=greedy(16)))[0]
    assert tokens_of(events) == cold
    assert events[-1].usage is not None and events[-1].usage.cached_tokens == 61


def test_cancel_and_stop_end_idle_prefills(tiny, make_engine) -> None:
    engine = make_engine(tiny, block_size=8)
    first: list[Event] = []
    second: list[Event] = []
    a, b = idle(list(range(200, 264))), idle(list(range(300, 364)))
    engine.submit(a, first.append)
    engine.submit(b, second.append)
    engine.step()
    engine.cancel(b.request_id)
    engine.run_until_idle()
    assert first[-1].finish_reason == "prefilled" and second[-1].finish_reason == "abort"


def test_a_cleared_cache_drops_the_idle_prefills_submitted_before(tiny, make_engine) -> None:
    """DELETE /v1/cache/prefix means empty: a next turn queued before it (or one chunk into
    it) stores nothing afterwards, while one submitted after the clear runs as usual."""
    engine = make_engine(tiny, block_size=8)
    before: list[Event] = []
    waiting: list[Event] = []
    engine.submit(idle(list(range(200, 264))), before.append)
    engine.submit(idle(list(range(300, 364))), waiting.append)
    engine.step()  # one chunk of the first, stored
    engine.clear_prefix_cache()
    engine.run_until_idle()
    assert before[-1].finish_reason == "abort" and waiting[-1].finish_reason == "abort"
    assert engine.cache.stats.entry_count == 0

    after: list[Event] = []
    engine.submit(idle(list(range(400, 464))), after.append)
    engine.run_until_idle()
    assert after[-1].finish_reason == "prefilled" and engine.cache.stats.entry_count == 8

    # A next turn scheduled before the clear but handed over after it (rendering takes a
    # while on the next-turn thread) is dropped too.
    late: list[Event] = []
    engine.submit(idle(list(range(500, 564))), late.append, clears_seen=engine.clears - 1)
    engine.run_until_idle()
    assert late[-1].finish_reason == "abort" and engine.cache.stats.entry_count == 8


def test_the_next_turn_prefix_ends_where_the_next_message_starts(embedded) -> None:
    builder = PromptBuilder(embedded.tokenizer)
    history = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What is a Helm chart?"},
        {"role": "assistant", "content": "A package of Kubernetes manifests."},
    ]
    (prefix,) = builder.next_turn(history)
    following = builder.chat([*history, {"role": "user", "content": "And kubectl apply?"}])
    end = following.message_starts[-1]
    assert prefix.tokens == following.tokens[:end]
    assert prefix.cuts == tuple(c for c in following.cuts if c < end)
    # The previous prompt is a strict prefix of it, answer and all.
    previous = builder.chat(history[:2])
    assert prefix.tokens[: len(previous.tokens)] == previous.tokens
    assert len(prefix.tokens) > len(previous.tokens) + 5

    calls = [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    with_call = [*history[:2], {"role": "assistant", "content": "", "tool_calls": calls}]
    prefixes = builder.next_turn(with_call, tool_call_ids=["call_1"])
    result = builder.chat([*with_call, {"role": "tool", "tool_call_id": "call_1", "content": "ok"}])
    start = result.message_starts[-1]
    assert prefixes[0].tokens == result.tokens[:start]
