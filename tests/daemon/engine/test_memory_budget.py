"""The prefix cache's byte budget holds, in its accounting and in MLX's real memory."""

from __future__ import annotations

import gc
import random

import mlx.core as mx

from support.engine import greedy, request, run
from warmfleet_daemon.engine import kv

VOCAB = (100, 49000)


def test_budget_holds_and_lru_blocks_are_evicted(tiny, make_engine) -> None:
    budget = 200_000  # tiny model: 768 bytes of KV per token, so ~260 tokens
    engine = make_engine(tiny, block_size=32, budget=budget)
    rng = random.Random(0)
    gc.collect()
    baseline = mx.get_active_memory()
    for _ in range(12):
        run(engine, request([rng.randrange(*VOCAB) for _ in range(150)], sampling=greedy(2)))
        stats = engine.cache.stats
        assert stats.bytes <= budget
    assert stats.evictions > 0 and stats.entry_count > 0
    # the accounting is the real size of what the blocks hold ...
    payloads = [engine.cache._blocks[k].payload for k in engine.cache.keys_lru_order()]
    assert sum(p.nbytes for p in payloads) == stats.bytes
    assert all(isinstance(layer, kv.KVSlice) for p in payloads for layer in p.layers)
    # ... and nothing else stays alive: no views into larger per-request buffers
    gc.collect()
    assert mx.get_active_memory() - baseline <= budget + 64 * 1024


def test_zero_budget_disables_the_cache(tiny, make_engine) -> None:
    engine = make_engine(tiny, budget=0)
    tokens = [random.Random(1).randrange(*VOCAB) for _ in range(100)]
    run(engine, request(tokens))
    events = run(engine, request(tokens))[0]
    assert events[-1].usage.cached_tokens == 0 and engine.cache.stats.entry_count == 0
