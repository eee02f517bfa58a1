"""What a prompt token costs this daemon in each tier, measured once at start.

The router weighs a RAM hit against a disk hit against a miss with these figures
(`CacheLayout.costs`), so they come from the real code paths on the loaded model: a
prefill chunk of `block_size` tokens through the model's forward (as the engine computes
one), a restore of that block's KV into fresh caches (`kv.restore`, as a prefix hit is
restored), and that block read into RAM from each attached tier as the tier reads it
(`CacheTier.read_seconds`: the disk writes it in its format in its directory and reads it
back; a peer is not priced). Each is timed up to _RUNS times within a small budget and
the fastest kept; the first pass of each is untimed (a warm-up).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Any

import mlx.core as mx

from warmfleet_common.chunking import Chunk
from warmfleet_common.tiers import Tier, TierCosts
from warmfleet_daemon.engine import kv
from warmfleet_daemon.engine.core import Engine
from warmfleet_daemon.kvtransfer.codec import BlockCodec

log = logging.getLogger(__name__)

DEFAULT_BUDGET_S = 1.5  # the whole measurement, at most about this long
_RUNS = 20  # timed runs of each path at most, fewer when the budget runs out


def measure_tier_costs(
    engine: Engine, codec: BlockCodec, budget_s: float = DEFAULT_BUDGET_S
) -> TierCosts:
    """Call before the engine thread starts (it runs the model on this thread), once the
    tiers are attached: each tier is priced by its own `read_seconds`."""
    size = engine.config.block_size
    vocab = max(int(getattr(engine.loaded.tokenizer, "vocab_size", 0) or 0), 2)
    tokens = mx.array([[(17 + 31 * i) % vocab for i in range(size)]], dtype=mx.int32)
    chunk = Chunk(0, size, b"\0" * 16)
    share = budget_s / (1 + len(engine.tiers))
    blocks: list[kv.BlockPayload] = []

    def fresh() -> list[Any]:
        return kv.new_caches(engine.model, engine.config.kv_bits, engine.kv_group_size)

    def prefill() -> None:
        caches = fresh()
        engine.model(tokens, cache=caches)
        mx.eval(kv.cache_arrays(caches))
        blocks[:] = [kv.extract_block(caches, 0, size)]

    def restore() -> None:
        caches = kv.restore(blocks, fresh(), size)
        mx.eval(kv.cache_arrays(caches))

    prefill_s = fastest_time(prefill, share)
    restore_s = fastest_time(restore, share)
    hit_us: dict[Tier, float] = {}
    for tier in engine.tiers:
        read_s = tier.read_seconds(blocks[0], chunk, share)
        if read_s is not None:  # a block read into RAM is then restored like a RAM one
            hit_us[tier.name] = (read_s + restore_s) * 1e6 / size
    mx.clear_cache()
    costs = TierCosts(
        prefill_us_per_token=prefill_s * 1e6 / size,
        hit_us_per_token=hit_us,
        kv_bytes_per_token=max(1, codec.kv_bytes_per_token()),
    )
    log.info(
        "Tier costs per token (a %d-token block, fastest runs): prefill %.1f us, a hit %s, "
        "%d KV bytes",
        size,
        costs.prefill_us_per_token,
        ", ".join(f"in {t} {us:.2f} us" for t, us in costs.hit_us_per_token.items()),
        costs.kv_bytes_per_token,
    )
    return costs


def fastest_time(run: Callable[[], None], budget_s: float) -> float:
    """The fastest of up to _RUNS timed runs after a warm-up run, within `budget_s` (the
    warm-up alone when it took the whole budget: a large model on a slow machine). The
    fastest, not the median: other processes only ever slow a run down."""
    started = time.perf_counter()
    run()
    if time.perf_counter() - started >= budget_s:
        return time.perf_counter() - started
    best = math.inf
    for _ in range(_RUNS):
        t0 = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - t0)
        if time.perf_counter() - started >= budget_s:
            break
    return best
