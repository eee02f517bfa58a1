"""What a prompt token costs this daemon in each tier, measured once at start.

The router weighs a RAM hit against a disk hit against a miss with these figures
(`CacheLayout.costs`), so they come from the real code paths on the loaded model: a
prefill chunk of `block_size` tokens through the model's forward (as the engine computes
one), a restore of that block's KV into fresh caches (`kv.restore`, as a prefix hit is
restored), and that block written in the disk tier's format in its directory and read
back as the disk tier reads it. Each is timed up to _RUNS times within a small budget
and the fastest kept; the first pass of each is untimed (a warm-up).
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx

from warmfleet_common.chunking import Chunk
from warmfleet_common.tiers import Tier, TierCosts
from warmfleet_daemon.engine import kv
from warmfleet_daemon.engine.core import Engine
from warmfleet_daemon.kvtransfer.codec import BlockCodec
from warmfleet_daemon.kvtransfer.disk_tier import SUFFIX
from warmfleet_daemon.support.regular_files import descriptor_path, open_regular

log = logging.getLogger(__name__)

DEFAULT_BUDGET_S = 1.5  # the whole measurement, at most about this long
_RUNS = 20  # timed runs of each path at most, fewer when the budget runs out


def measure_tier_costs(
    engine: Engine,
    codec: BlockCodec,
    disk_directory: Path | None,
    budget_s: float = DEFAULT_BUDGET_S,
) -> TierCosts:
    """Call before the engine thread starts (it runs the model on this thread)."""
    size = engine.config.block_size
    vocab = max(int(getattr(engine.loaded.tokenizer, "vocab_size", 0) or 0), 2)
    tokens = mx.array([[(17 + 31 * i) % vocab for i in range(size)]], dtype=mx.int32)
    chunk = Chunk(0, size, b"\0" * 16)
    share = budget_s / (3 if disk_directory is not None else 2)
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

    prefill_s = _fastest_time(prefill, share)
    restore_s = _fastest_time(restore, share)
    disk_s = None
    if disk_directory is not None:
        disk_s = _disk_read_time(codec, blocks[0], chunk, disk_directory, share)
    mx.clear_cache()
    hit_us: dict[Tier, float] = {"ram": restore_s * 1e6 / size}
    if disk_s is not None:
        hit_us["disk"] = (disk_s + restore_s) * 1e6 / size
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


def _fastest_time(run: Callable[[], None], budget_s: float) -> float:
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


def _disk_read_time(
    codec: BlockCodec, payload: kv.BlockPayload, chunk: Chunk, directory: Path, budget_s: float
) -> float | None:
    """A block written as the disk tier writes one (a "." file: a restart deletes it if
    we die meanwhile) and read back as it reads one; None if the directory refuses it
    (the tier itself reports why)."""
    path = directory / f".cost-probe-{os.getpid()}{SUFFIX}"
    try:
        codec.save(payload, chunk, str(path))
        _drop_from_page_cache(path)

        def read() -> None:
            with open_regular(path, codec.max_block_bytes(chunk.size)) as fd:
                codec.from_file(descriptor_path(fd, path), chunk)  # evaluated and checked
            _drop_from_page_cache(path)

        return _fastest_time(read, budget_s)
    except Exception as exc:
        log.warning("Could not measure the disk tier's read cost in %s: %s", directory, exc)
        return None
    finally:
        path.unlink(missing_ok=True)


def _drop_from_page_cache(path: Path) -> None:
    # A block read back was usually written long before: read it from the device where
    # the OS lets us say so (Linux); macOS has no posix_fadvise.
    advise = getattr(os, "posix_fadvise", None)
    if advise is None:
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        advise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
