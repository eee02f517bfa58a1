"""Quantized KV (--kv-bits 8|4, mlx-lm's QuantizedKVCache; on the CPU a prefill chunk
attends over the dequantized KV): the invariant holds within a setting (a cached response
is the uncached one under the same bits, from RAM, from disk, and decoded beside others),
blocks take a fraction of the bytes, and a block of one setting never serves another (the
fingerprint)."""

from __future__ import annotations

import dataclasses
import random

import mlx.core as mx
import pytest
from mlx_lm.models import base
from mlx_lm.models.cache import QuantizedKVCache

from support.engine import greedy, model, request, run, tokens_of
from warmfleet_daemon.engine import attention
from warmfleet_daemon.engine.core import Engine
from warmfleet_daemon.engine.requests import EngineConfig
from warmfleet_daemon.kvtransfer.codec import BlockCodec, probe_layout
from warmfleet_daemon.kvtransfer.disk_tier import DiskTier
from warmfleet_daemon.kvtransfer.fingerprint import model_fingerprint
from warmfleet_daemon.models.loader import LoadedModel
from warmfleet_daemon.models.tiny import tiny_random_model

VOCAB = (100, 49000)


@pytest.fixture(scope="module")
def wide() -> LoadedModel:
    """The tiny llama with 32-wide heads (quantization groups are 32 or 64 wide)."""
    base = model("tiny-random")
    weights = tiny_random_model(
        vocab_size=base.model.args.vocab_size, num_attention_heads=2, num_key_value_heads=1
    )
    return dataclasses.replace(base, model=weights)


def engine(loaded: LoadedModel, bits: int | None, budget: int = 1 << 30) -> Engine:
    return Engine(loaded, EngineConfig(16, budget, 16, kv_bits=bits))


def tokens(seed: int, length: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(*VOCAB) for _ in range(length)]


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("kind", ["full", "partial-at-cut", "partial-no-cut", "strict-prefix"])
def test_cached_equals_uncached_under_the_same_bits(wide, bits: int, kind: str) -> None:
    prompt = tokens(bits, 90)
    cuts = () if kind == "partial-no-cut" else (40,)
    e = engine(wide, bits)
    cold = tokens_of(run(e, request(prompt, cuts, sampling=greedy(16)))[0])
    if kind != "full":
        e.clear_prefix_cache()
        if kind == "strict-prefix":
            run(e, request(prompt[:40], prefill_only=True))
        else:
            run(e, request(prompt[:60] + tokens(99, 20), cuts))
    events = run(e, request(prompt, cuts, sampling=greedy(16)))[0]
    assert tokens_of(events) == cold
    usage = events[-1].usage
    assert usage is not None
    assert (
        usage.cached_tokens
        == {
            "full": 90,
            "partial-at-cut": 56,
            "partial-no-cut": 48,
            "strict-prefix": 40,
        }[kind]
    )


def test_decoding_beside_others_changes_nothing(wide) -> None:
    e = engine(wide, 8)
    prompts = [tokens(10 + i, 30 + 17 * i) for i in range(3)]
    alone = [tokens_of(run(e, request(p, sampling=greedy(12)))[0]) for p in prompts]
    e.clear_prefix_cache()
    together = run(e, *[request(p, sampling=greedy(12)) for p in prompts])
    assert [tokens_of(t) for t in together] == alone
    assert e.decode_path == "mlx-lm forward, attention per sequence"


def test_blocks_take_a_fraction_of_the_bytes(wide) -> None:
    full = engine(wide, None).block_bytes(4096)
    # 32-wide groups, float32 scales and biases: (1 + 8/32) / 4 and (0.5 + 8/32) / 4.
    assert engine(wide, 8).block_bytes(4096) / full == pytest.approx(0.3125, rel=0.02)
    assert engine(wide, 4).block_bytes(4096) / full == pytest.approx(0.1875, rel=0.02)


def test_quantized_blocks_come_back_from_disk_like_scratch(wide, tmp_path) -> None:
    prompt = tokens(7, 100)
    e = engine(wide, 8)
    cold = tokens_of(run(e, request(prompt, (40,), sampling=greedy(16)))[0])
    fingerprint = model_fingerprint(wide, 16, 8)
    codec = BlockCodec(fingerprint, probe_layout(wide.model, 8, e.kv_group_size))
    disk = DiskTier(tmp_path, codec, 1 << 30, e.cache)
    e.attach_tier(disk)
    run(e, request(prompt, (40,), sampling=greedy(16)))  # stored: written behind
    assert disk.save_all()
    disk.stop()

    restarted = engine(wide, 8)
    disk = DiskTier(tmp_path, codec, 1 << 30, restarted.cache)
    restarted.attach_tier(disk)
    try:
        events = run(restarted, request(prompt, (40,), sampling=greedy(16)))[0]
    finally:
        disk.stop()
    usage = events[-1].usage
    assert tokens_of(events) == cold
    assert usage is not None and usage.cached_tokens == usage.cached["disk"] == 100


def test_each_setting_has_its_own_fingerprint(wide) -> None:
    prints = {model_fingerprint(wide, 16, bits) for bits in (None, 8, 4)}
    assert len(prints) == 3


def test_a_model_whose_heads_cannot_be_grouped_is_refused(tiny) -> None:
    with pytest.raises(Exception, match="--kv-bits 8"):
        engine(tiny, 8)  # 16-wide heads


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("causal", [True, False])
def test_a_cpu_prefill_chunk_attends_as_mlx_lms_quantized_attention(bits, causal) -> None:
    """On the CPU a chunk attends over the cache's keys and values dequantized (mlx's
    quantized matmul is slow there); it must compute what mlx-lm's quantized attention does."""
    mx.random.seed(bits)
    cache = QuantizedKVCache(group_size=32, bits=bits)
    cache.update_and_fetch(mx.random.normal((1, 2, 70, 32)), mx.random.normal((1, 2, 70, 32)))
    keys, values = cache.update_and_fetch(
        mx.random.normal((1, 2, 30, 32)), mx.random.normal((1, 2, 30, 32))
    )
    queries = mx.random.normal((1, 4, 30, 32))  # two query heads per KV head
    mask = "causal" if causal else None
    ours = attention.dequantized_attention(queries, keys, values, 32, bits, 0.17, causal=causal)
    theirs = base.scaled_dot_product_attention(
        queries, keys, values, cache=cache, scale=0.17, mask=mask
    )
    assert ours.shape == theirs.shape == (1, 4, 30, 32)
    assert mx.allclose(ours, theirs, atol=1e-5).item()
