"""The LM head: a pre-transposed copy on the CPU gives the model's own logits."""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from support.engine import model
from warmfleet_daemon.engine.head import Head


def test_the_cpu_head_reads_a_transposed_copy_and_gives_the_models_logits() -> None:
    loaded = model("tiny-random")
    inputs = mx.array([[5, 17, 300, 42], [7, 8, 9, 10]])
    want = loaded.model(inputs, cache=make_prompt_cache(loaded.model))[:, -1, :]
    cpu = Head(loaded.model, cpu=True)
    assert cpu.transposed is not None
    assert mx.allclose(cpu(inputs, make_prompt_cache(loaded.model)), want, atol=1e-5).item()
    metal = Head(loaded.model, cpu=False)  # Metal: the model's own head, no copy
    assert metal.transposed is None
    assert mx.allclose(metal(inputs, make_prompt_cache(loaded.model)), want, atol=1e-5).item()


def test_models_with_other_heads_are_called_whole() -> None:
    loaded = model("tiny-random-lfm2")
    head = Head(loaded.model, cpu=True)
    inputs = mx.array([[5, 17, 300]])
    want = loaded.model(inputs, cache=make_prompt_cache(loaded.model))[:, -1, :]
    assert not head.plain and head.transposed is None
    assert mx.array_equal(head(inputs, make_prompt_cache(loaded.model)), want).item()
