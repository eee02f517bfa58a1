"""The simulated engine: the real engine's decisions (what is cached, computed, evicted)
with the forward pass replaced by a profile's times, and deterministic answers."""

from __future__ import annotations

import pytest

from support.engine import greedy, request, run, tokens_of
from warmfleet_common.perf_profile import PerfProfile, RatePoint
from warmfleet_daemon.engine.core import Engine
from warmfleet_daemon.engine.requests import EngineConfig, EngineError
from warmfleet_daemon.models.loader import LoadedModel
from warmfleet_daemon.sim.engine import SimEngine
from warmfleet_daemon.sim.loader import simulated_model

BLOCK = 16


def profile(**overrides: object) -> PerfProfile:
    fields: dict[str, object] = {
        "name": "test-mac",
        "machine": "a Mac in a test",
        "model": "test-7b",
        "source": "made up for the tests",
        "context_length": 4096,
        "block_size": BLOCK,
        "kv_bytes_per_token": 1000,
        "logits_bytes": 500,
        "memory_budget_bytes": 1 << 30,
        "prefill": [RatePoint(at=0, tokens_per_s=1000), RatePoint(at=1000, tokens_per_s=500)],
        "decode": [RatePoint(at=1, tokens_per_s=50), RatePoint(at=4, tokens_per_s=25)],
        "decode_reference_context": 100,
        "decode_by_context": [
            RatePoint(at=100, tokens_per_s=50),
            RatePoint(at=1100, tokens_per_s=25),
        ],
        "restore": {"ram": 100_000},
    }
    fields.update(overrides)
    return PerfProfile.model_validate(fields)


def sim(prof: PerfProfile, budget: int = 1 << 30, answer_tokens: int = 64) -> SimEngine:
    config = EngineConfig(prof.block_size, budget, max_num_seqs=8)
    return SimEngine(simulated_model(prof), config, prof, speed=1e6, answer_tokens=answer_tokens)


def prompts() -> list[list[int]]:
    """Sessions sharing a system prompt, growing turn by turn, and strangers."""
    system = [(7 * i) % 300 + 5 for i in range(70)]
    out = []
    for session in range(3):
        history = [*system]
        for turn in range(3):
            history += [(session * 31 + turn * 17 + j) % 400 + 3 for j in range(23)]
            out.append(list(history))
    out += [[(i * 13 + 1) % 500 + 2 for i in range(90)], [*system, 9, 9, 9]]
    return out


def test_sim_caches_hits_and_evicts_as_the_real_engine_does(tiny: LoadedModel) -> None:
    real = Engine(tiny, EngineConfig(BLOCK, 1 << 30, max_num_seqs=8))
    probe = run(real, request(list(range(3, 40)), sampling=greedy(1)))
    assert probe
    logits_bytes = next(
        b.payload.logits.nbytes
        for b in real.cache.snapshot(list)[0]
        if b.payload.logits is not None
    )
    per_token = real._bytes_per_token
    assert per_token == int(per_token)
    prof = profile(kv_bytes_per_token=int(per_token), logits_bytes=logits_bytes)
    # A budget of a few sessions' blocks: the later prompts evict the earlier ones.
    budget = int(120 * per_token + 3 * logits_bytes)
    real = Engine(tiny, EngineConfig(BLOCK, budget, max_num_seqs=8))
    simulated = sim(prof, budget)
    for tokens in prompts():
        a = run(real, request(tokens, sampling=greedy(3)))[0][-1]
        b = run(simulated, request(tokens, sampling=greedy(3)))[0][-1]
        assert a.usage is not None and b.usage is not None
        assert b.usage.cached == a.usage.cached, tokens[:5]
        assert simulated.cache.stats == real.cache.stats
    assert real.cache.stats.evictions > 0


def test_time_spent_is_the_profiles(tiny: LoadedModel) -> None:
    prof = profile()
    engine = sim(prof)
    tokens = list(range(3, 3 + 5 * BLOCK + 4))  # 84 tokens: six chunks
    run(engine, request(tokens, sampling=greedy(5)))
    decode = sum(prof.decode_step_seconds(1, len(tokens) + i) for i in range(1, 5))
    chunks = engine.plan(request(tokens).prompt)
    assert len(chunks) == 6
    cold = sum(prof.prefill_seconds(c.start, c.end) for c in chunks) + decode
    assert engine.clock.spent_s == pytest.approx(cold, rel=1e-6)
    # Again: every chunk but the last (its logits are kept with it, so all of them) cached.
    run(engine, request(tokens, sampling=greedy(5)))
    warm = prof.restore_seconds("ram", len(tokens)) + decode
    assert engine.clock.spent_s - cold == pytest.approx(warm, rel=1e-6)


def test_an_entirely_cached_prompt_restores_after_its_first_token(tiny: LoadedModel) -> None:
    """As the real engine: the first token comes from the logits kept with the last
    block; the KV is restored in the next decode step (never, if there is none)."""
    prof = profile()
    engine = sim(prof)
    tokens = list(range(3, 3 + 3 * BLOCK))
    run(engine, request(tokens, sampling=greedy(1)))
    cold = engine.clock.spent_s
    run(engine, request(tokens, sampling=greedy(1)))
    assert engine.clock.spent_s == cold  # one token: nothing computed, nothing restored
    run(engine, request(tokens, sampling=greedy(2)))
    paid = prof.restore_seconds("ram", len(tokens)) + prof.decode_step_seconds(1, len(tokens) + 1)
    assert engine.clock.spent_s - cold == pytest.approx(paid, rel=1e-6)


def test_a_batch_decodes_at_the_batch_rate(tiny: LoadedModel) -> None:
    prof = profile()
    engine = sim(prof)
    steps: list[list[int]] = []  # each decode step's contexts
    charge = engine.forward.decode_step

    def recorded(contexts: list[int]) -> None:
        steps.append(list(contexts))
        charge(contexts)

    engine.forward.decode_step = recorded  # type: ignore[method-assign]
    a, b = [list(range(3 + k, 3 + k + BLOCK)) for k in (0, 100)]
    run(engine, request(a, sampling=greedy(3)), request(b, sampling=greedy(3)))
    assert any(len(c) == 2 for c in steps)  # the two decoded side by side
    prefill = 2 * prof.prefill_seconds(0, BLOCK)
    decode = sum(prof.decode_step_seconds(len(c), sum(c) / len(c)) for c in steps)
    assert engine.clock.spent_s == pytest.approx(prefill + decode, rel=1e-6)


def test_answers_are_deterministic_and_end(tiny: LoadedModel) -> None:
    engine = sim(profile(), answer_tokens=6)
    tokens = list(range(3, 60))
    first = run(engine, request(tokens, sampling=greedy(50)))[0]
    second = run(engine, request(tokens, sampling=greedy(50)))[0]
    assert tokens_of(first) == tokens_of(second)
    assert first[-1].finish_reason == "stop"
    assert first[-1].usage is not None and first[-1].usage.completion_tokens == 7  # and EOS
    other = run(engine, request([*tokens, 77], sampling=greedy(4)))[0]
    assert other[-1].finish_reason == "length"
    assert tokens_of(other) != tokens_of(first)[:4]  # another prompt starts elsewhere


def test_ignore_eos_runs_to_max_tokens(tiny: LoadedModel) -> None:
    engine = sim(profile(), answer_tokens=3)
    events = run(engine, request(list(range(3, 40)), sampling=greedy(9, ignore_eos=True)))[0]
    assert events[-1].finish_reason == "length"
    assert len(tokens_of(events)) == 9


def test_quantized_kv_is_refused() -> None:
    prof = profile()
    with pytest.raises(EngineError, match="kv-bits"):
        SimEngine(simulated_model(prof), EngineConfig(BLOCK, 1 << 20, kv_bits=8), prof)
