"""The engine's prefill order under sustained load: a long prompt is not starved by a
stream of short ones (aging), and the short ones still overtake it until it has aged."""

from __future__ import annotations

import random

from support.engine import greedy, request
from warmfleet_daemon.engine import prefill_order
from warmfleet_daemon.engine.core import Engine
from warmfleet_daemon.engine.requests import EngineConfig, Event

VOCAB = (100, 49000)


def test_a_long_prompt_gets_its_first_token_under_a_stream_of_short_ones(tiny, make_engine):
    rng = random.Random(9)
    block = 16
    engine = make_engine(tiny, block_size=block, max_num_seqs=64)
    long_events: list[Event] = []
    engine.submit(
        request([rng.randrange(*VOCAB) for _ in range(320)], sampling=greedy(1)),
        long_events.append,
    )
    first_token_step = None
    short_done = 0
    bound = 320 // block * prefill_order.AGING_PICKS + 320 // block + 2
    steps = 2 * (bound // 2 + 10)  # past the bound, an even count: one short per 2 steps
    for step in range(steps):
        if step % 2 == 0:  # a fresh 24-token prompt every other step: 2 chunks each
            prompt = [rng.randrange(*VOCAB) for _ in range(24)]

            def count(e: Event) -> None:
                nonlocal short_done
                short_done += e.finish_reason is not None

            engine.submit(request(prompt, sampling=greedy(1)), count)
        engine.step()
        if long_events and first_token_step is None:
            first_token_step = step
    engine.run_until_idle()
    # Its 20 chunks start within ~320/16*AGING_PICKS steps and then run back to back.
    assert first_token_step is not None
    assert first_token_step <= bound
    assert short_done == steps // 2  # and every short prompt was served too


def test_another_tenants_short_prompt_takes_the_next_chunk_after_an_aged_burst(tiny):
    """Tenant `burst` has three long prompts aged past a short prompt's size (with one
    block of age a pick, aging alone runs them to the end first); tenant `steady`'s short prompt,
    arriving then, is prefilled in the next step, where the same prompt from `burst`
    itself waits for the aged ones."""
    rng = random.Random(11)
    block = 16
    longs = [[rng.randrange(*VOCAB) for _ in range(40 * block)] for _ in range(3)]
    short = [rng.randrange(*VOCAB) for _ in range(block)]

    def first_token_step(tenant: str) -> int:
        engine = Engine(tiny, EngineConfig(block, 1 << 30, 16, prefill_aging_picks=1))
        for prompt in longs:
            engine.submit(request(prompt, sampling=greedy(1), tenant="burst"), lambda e: None)
        for _ in range(45):  # each long prompt: 45 blocks less to go, in chunks or in age
            engine.step()
        events: list[Event] = []
        engine.submit(request(short, sampling=greedy(1), tenant=tenant), events.append)
        for step in range(200):
            engine.step()
            if events:
                engine.run_until_idle()
                return step
        raise AssertionError("the short prompt never got its first token")

    assert first_token_step("steady") == 0
    assert first_token_step("burst") > 10
