"""The hand-written decode step (engine/decode_forward.py): it computes what mlx-lm's
forward computes, leaves the model's weights (and so prefill) unchanged, and a row's
logits are bitwise the same whatever batch it is in."""

from __future__ import annotations

import random

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx.utils import tree_flatten, tree_map
from mlx_lm.models import llama, qwen2
from mlx_lm.models.cache import KVCache, make_prompt_cache

from support.engine import model
from warmfleet_daemon.engine import activation, attention, decode_forward
from warmfleet_daemon.engine.decode_batch import DecodeBatch
from warmfleet_daemon.engine.decode_forward import DecodeForward, _Rotation
from warmfleet_daemon.engine.head import Head

VOCAB = 500


def built(arch: str, **overrides: object) -> nn.Module:
    """A small random float32 model of mlx-lm's llama or qwen2 module."""
    mx.random.seed(3)
    common = dict(
        model_type=arch,
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=2,
        intermediate_size=96,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-5,
        max_position_embeddings=4096,
        tie_word_embeddings=arch == "llama",
    )
    common.update(overrides)
    module = llama if arch == "llama" else qwen2
    m = module.Model(module.ModelArgs(**common))  # type: ignore[arg-type]
    m.update(tree_map(lambda p: (p * 3.0).astype(mx.float32), m.parameters()))
    mx.eval(m.parameters())
    attention.install(m, cpu=True)
    activation.install(m, cpu=True)
    return m


def prefilled(m: nn.Module, tokens: list[int]) -> tuple[list[KVCache], mx.array]:
    caches = make_prompt_cache(m)
    logits = m(mx.array([tokens]), cache=caches)[:, -1, :]
    mx.eval(logits, [c.state for c in caches])
    return caches, logits


def decode_with_mlx_lm(m: nn.Module, prompts: list[list[int]], steps: int) -> list[mx.array]:
    """Each prompt decoded alone by mlx-lm's forward, greedy: logits per step."""
    out = []
    for p in prompts:
        caches, logits = prefilled(m, p)
        rows = []
        for _ in range(steps):
            token = mx.argmax(logits, axis=-1)
            logits = m(token[:, None], cache=caches)[:, -1, :]
            rows.append(logits)
        out.append(mx.concatenate(rows))
    return out


def decode_by_hand(m: nn.Module, prompts: list[list[int]], steps: int) -> list[mx.array]:
    """The same prompts decoded together in a decode batch by DecodeForward."""
    forward, head = DecodeForward(m), Head(m, cpu=True)
    batch = DecodeBatch(max_rows=len(prompts), streams=1)
    last = []
    for p in prompts:
        caches, logits = prefilled(m, p)
        batch.admit(caches)
        last.append(logits)
    logits = mx.concatenate(last)
    per_row: list[list[mx.array]] = [[] for _ in prompts]
    for _ in range(steps):
        tokens = mx.argmax(logits, axis=-1)
        logits = head.project(forward(tokens, batch.step_views()))
        mx.eval(logits, batch.buffers())
        batch.advance()
        for i in range(len(prompts)):
            per_row[i].append(logits[i : i + 1])
    return [mx.concatenate(r) for r in per_row]


@pytest.mark.parametrize(
    ("arch", "overrides"),
    [
        ("llama", {}),
        ("llama", {"rope_traditional": True}),  # GGUF's layout (the embedded model)
        ("qwen2", {}),  # biases on q, k, v; an untied head
    ],
)
def test_it_computes_what_mlx_lms_forward_computes(arch, overrides) -> None:
    m = built(arch, **overrides)
    assert decode_forward.supports(m)
    rng = random.Random(5)
    prompts = [[rng.randrange(VOCAB) for _ in range(n)] for n in (3, 70, 130)]
    want = decode_with_mlx_lm(m, prompts, steps=6)
    got = decode_by_hand(m, prompts, steps=6)
    for g, w in zip(got, want):  # float32 rounding apart (logits here reach ~20)
        assert (mx.abs(g - w).max() / mx.abs(w).max()).item() < 1e-4
        assert mx.array_equal(g.argmax(-1), w.argmax(-1)).item()


@pytest.mark.parametrize("traditional", [True, False])
@pytest.mark.parametrize("dims", [16, 12])  # 12 of 16: partial rotary
def test_rotation_matrices_are_ropes_rotation(traditional, dims) -> None:
    rope = nn.RoPE(dims, traditional=traditional, base=10000.0, scale=0.5)
    positions = mx.array([0, 1, 37, 900])
    x = mx.random.normal((4, 6, 1, 16), key=mx.random.key(2))
    want = mx.fast.rope(x, dims, traditional=traditional, base=10000.0, scale=0.5, offset=positions)
    got = (x[:, :, 0, :] @ _Rotation(rope, 16).matrices(positions))[:, :, None, :]
    assert mx.allclose(got, want, atol=1e-4).item()


def test_fusing_the_projections_changes_no_weight_and_no_prefill() -> None:
    m = built("llama")
    before = {k: mx.array(v) for k, v in tree_flatten(m.parameters())}
    tokens = [5, 17, 300, 42, 9]
    _, want = prefilled(m, tokens)
    DecodeForward(m)
    after = dict(tree_flatten(m.parameters()))
    assert after.keys() == before.keys()
    assert all(mx.array_equal(after[k], before[k]).item() for k in before)
    _, got = prefilled(m, tokens)
    assert mx.array_equal(got, want).item()


def test_a_rows_logits_do_not_depend_on_its_batch_on_the_embedded_model() -> None:
    """Up to 16 rows (the engine's default max_num_seqs): BLAS kernels change with the
    number of rows past some count, which is why the matmuls run in row groups."""
    loaded = model("default")
    forward, head = DecodeForward(loaded.model), Head(loaded.model, cpu=True)
    rng = random.Random(8)
    prompts = [[rng.randrange(100, 49000) for _ in range(4 + 3 * i)] for i in range(16)]
    prefills = [prefilled(loaded.model, p)[0] for p in prompts]
    tokens = mx.array([rng.randrange(100, 49000) for _ in prompts])

    def step(rows: list[int]) -> mx.array:
        batch = DecodeBatch(max_rows=16, streams=1)
        for r in rows:
            batch.admit(prefills[r])
        logits = head.project(forward(tokens[mx.array(rows)], batch.step_views()))
        mx.eval(logits)
        return logits

    alone = step([0])
    for count in (2, 8, 13, 16):
        together = step(list(range(count)))
        assert mx.array_equal(together[0:1], alone).item(), f"row 0 changed in {count} rows"
    last = step([15])
    assert mx.array_equal(step(list(range(16)))[15:16], last).item()


def test_other_architectures_keep_mlx_lms_forward(make_engine) -> None:
    for spec in ("tiny-random-lfm2", "tiny-random-gemma3"):
        assert not decode_forward.supports(model(spec).model)
    assert make_engine(model("tiny-random")).decoder.path.forward is not None


def test_swiglu_through_exp2_is_silu_times_x() -> None:
    gate = mx.array([-1000.0, -30.0, -1.5, 0.0, 0.3, 4.0, 30.0, 1000.0])
    x = mx.array([2.0, -1.0, 3.0, 5.0, -2.0, 0.5, 1.0, 1.0])
    got = activation.swiglu(gate, x)
    assert not mx.isnan(got).any().item()
    assert mx.allclose(got, nn.silu(gate) * x, atol=1e-5, rtol=1e-5).item()
