"""Which code path the engine takes, chosen at load: the switch that runs the Mac path
on any device, the decode path logged per family, and the per-sequence fallback for a
model whose layers cannot decode in a batch."""

from __future__ import annotations

import logging
import random

import pytest
from mlx_lm.models import base, gemma2
from pydantic import ValidationError

from support.engine import greedy, request, run, tokens_of
from warmfleet_daemon.engine.core import Engine
from warmfleet_daemon.engine.requests import EngineConfig
from warmfleet_daemon.models.loader import LoadedModel, for_path, on_gpu
from warmfleet_daemon.models.tiny import tiny_random_model
from warmfleet_daemon.settings import ENGINE_PATH_ENV, DaemonSettings


def test_the_switch_runs_the_mac_path_anywhere_and_refuses_typos(monkeypatch) -> None:
    monkeypatch.setenv(ENGINE_PATH_ENV, "metal")
    assert on_gpu()
    monkeypatch.setenv(ENGINE_PATH_ENV, "auto")
    assert not on_gpu()  # no Metal GPU on this machine
    monkeypatch.setenv(ENGINE_PATH_ENV, "gpu")
    with pytest.raises(ValueError, match="WARMFLEET_ENGINE_PATH='gpu'"):
        on_gpu()
    with pytest.raises(ValidationError, match="expected one of auto, metal"):
        DaemonSettings()  # so `warmfleet serve` stops at start with the reason


def test_the_decode_path_is_logged_with_the_family(tiny, caplog) -> None:
    with caplog.at_level(logging.INFO, logger="warmfleet_daemon.engine.core"):
        Engine(tiny, EngineConfig(32, 1 << 20))
    assert "decode path for llama: batched rows, hand-written llama-family step" in caplog.text


@pytest.mark.parametrize("path", ["cpu", "metal"])
def test_a_model_whose_layers_cannot_decode_in_a_batch_decodes_per_sequence(
    path, tiny, monkeypatch, caplog
) -> None:
    """A module that imports mlx-lm's attention function but computes (softcapped)
    attention itself on the keys its cache returns, as phi3small's block-sparse layers
    do: here gemma2's, given the import it lacks. Its caches are plain KV, so batching
    looks possible; the load-time check finds that the layers fail on a batch's views
    and the engine decodes one sequence per forward, on both paths."""
    monkeypatch.setenv(ENGINE_PATH_ENV, "metal" if path == "metal" else "auto")
    monkeypatch.setattr(
        gemma2, "scaled_dot_product_attention", base.scaled_dot_product_attention, raising=False
    )
    model = for_path(tiny_random_model(vocab_size=len(tiny.tokenizer), arch="gemma2"), on_gpu())
    loaded = LoadedModel(model, tiny.tokenizer, "gemma2", "x", 8192, on_gpu())
    with caplog.at_level(logging.WARNING):
        engine = Engine(loaded, EngineConfig(16, 1 << 30))
    assert engine.decode_path.startswith(
        "one mlx-lm forward per sequence (batched decode failed its check: "
    ), engine.decode_path
    assert "gemma2: batched decode failed its check" in caplog.text
    rng = random.Random(3)
    prompts = [[rng.randrange(100, 49000) for _ in range(n)] for n in (30, 7, 52)]
    solo = [tokens_of(run(engine, request(p, sampling=greedy(8)))[0]) for p in prompts]
    engine.clear_prefix_cache()
    together = run(engine, *[request(p, sampling=greedy(8)) for p in prompts])
    assert [tokens_of(e) for e in together] == solo
