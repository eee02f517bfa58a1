"""The model matrix: every family Mac users run, served token for token as mlx-lm
computes it, on both engine paths.

Each case builds a tiny random model from mlx-lm's own class for the family
(`models/tiny.py`: config.json-style dicts, hidden 64, 2-4 layers, the embedded model's
tokenizer), casts or quantizes it, prepares it as the loader does for the path
(`loader.for_path`), and checks, greedy, 12 tokens, on 90-102-token prompts:

1. output identical to `mlx_lm.stream_generate` on the same weights (the model as the
   engine runs it: float32 after loading on the CPU path, as stored on the Mac path),
   with mlx-lm's own attention and activation functions swapped back in;
2. uncached (from scratch) == cached (the 90-token prefix warm and pinned);
3. batched == solo (three prompts of different lengths at once, cold and warm);
4. a KV snapshot written to disk and restored by a new engine, and blocks copied from
   a warm peer over HTTP, answer as from scratch, with the prefix counted as cached;
5. the decode path the README states for the family.

Then, as a user would: a 4-bit tiny deepseek_v3 written as an mlx-lm directory and
served by `warmfleet serve --model DIR` on each path answers chat requests over HTTP
(cold, cached, four at once) with mlx-lm's greedy text; and an architecture the engine
cannot serve (deepseek_v41, whose cache cannot be rebuilt from a stored block) is
refused at start with its name, every request a 503 saying why, never a 500.

Paths: "cpu" is what a Linux node runs (float32 weights, the decode batch's rows,
exp2 attention, the hand-written step for llama/qwen2; 16-token blocks here so a
prompt spans several); "metal" is the Mac code path forced on the CPU with
WARMFLEET_ENGINE_PATH=metal (weights kept as stored, per-sequence mx.fast attention,
512-token blocks, so chunks end only at the prompts' message cuts).

What runs where, and why (73 cases; 2-4 s each here, about three minutes in all):

- float32: every family on both paths. This is where the engine's own code differs per
  family (batch layout, MLA, hooks, caches that cannot be sliced).
- 4-bit (mlx-lm's affine quantization, group 32): a family per kind of quantized layer
  on both paths: llama (Linear, Embedding; the hand-written step after dequantizing),
  qwen3_moe and gpt_oss (SwitchLinear experts; sinks), deepseek_v3 (MLA's per-head
  MultiLinear, which mlx-lm's dequantize_model skips), gemma3_text (rotating caches),
  qwen3_next (gated delta-net), mamba2 (state-space). On the CPU path quantized
  weights are dequantized at load, on the Mac path they stay quantized.
- bfloat16: llama, qwen3, gemma3_text, lfm2 and mamba2 on both paths (the Mac path
  computes in bf16: KV, rotating windows and SSM states in bf16), plus qwen3_moe and
  deepseek_v3 on the CPU path only: mlx's CPU kernel for expert matmuls (GatherMM) is
  float32-only, so bf16 MoE models run on the Mac path on Metal but cannot on a CPU;
  mlx-lm itself fails there too.

The slowest cases (gemma3_text's, about 1.6 s each here, and the two daemons served
over HTTP) carry the `slow_model` marker; they still run in `make test`
(`-m "not slow_model"` leaves them out locally).
"""

from __future__ import annotations

import contextlib
import random
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import mlx.core as mx
import pytest
from mlx.utils import tree_map
from mlx_lm.generate import stream_generate
from mlx_lm.models import activations
from mlx_lm.utils import load, quantize_model

from support.engine import request, run, tokens_of
from support.kv import Peer, answer, from_scratch, prompts, warm_and_snapshot
from support.processes import serving, start_daemon
from warmfleet_common.prompts import RenderedPrompt
from warmfleet_daemon.api.app import create_app
from warmfleet_daemon.engine import activation, attention
from warmfleet_daemon.engine.core import Engine
from warmfleet_daemon.engine.requests import EngineConfig
from warmfleet_daemon.kvtransfer.transfer import KVTransfer
from warmfleet_daemon.models.convert import write_model_dir
from warmfleet_daemon.models.loader import LoadedModel, for_path, on_gpu
from warmfleet_daemon.models.tiny import tiny_config, tiny_random_model
from warmfleet_daemon.settings import ENGINE_PATH_ENV, DaemonSettings

HAND_WRITTEN = "batched rows, hand-written llama-family step"
ROWS = "batched rows, mlx-lm forward"
PER_SEQUENCE_ATTENTION = "mlx-lm forward, attention per sequence"
MLA = ", latent attention (MLA)"
ONE_EACH = "one mlx-lm forward per sequence"

# family: (CPU path, Mac path), as the README's model table states them.
PATHS: dict[str, tuple[str, str]] = {
    "llama": (HAND_WRITTEN, PER_SEQUENCE_ATTENTION),
    "qwen2": (HAND_WRITTEN, PER_SEQUENCE_ATTENTION),
    "qwen3": (ROWS, PER_SEQUENCE_ATTENTION),
    "qwen3_moe": (ROWS, PER_SEQUENCE_ATTENTION),
    "mistral3": (ROWS, PER_SEQUENCE_ATTENTION),
    "phi3": (ROWS, PER_SEQUENCE_ATTENTION),
    "olmo2": (ROWS, PER_SEQUENCE_ATTENTION),
    "granite": (ROWS, PER_SEQUENCE_ATTENTION),
    "deepseek_v2": (ROWS, PER_SEQUENCE_ATTENTION),
    "deepseek_v3": (ROWS + MLA, PER_SEQUENCE_ATTENTION + MLA),
    "kimi_k2": (ROWS + MLA, PER_SEQUENCE_ATTENTION + MLA),
    "glm4_moe_lite": (ROWS + MLA, PER_SEQUENCE_ATTENTION + MLA),
    "gemma2": (ONE_EACH,) * 2,  # softcapped attention computed in the layer
    "gemma3_text": (ONE_EACH,) * 2,  # sliding-window layers: rotating caches
    "gpt_oss": (ONE_EACH,) * 2,  # sliding-window layers, sinks
    "qwen3_next": (ONE_EACH,) * 2,  # gated delta-net state
    "lfm2": (ONE_EACH,) * 2,  # short-convolution state
    "mamba2": (ONE_EACH,) * 2,  # state-space model
}
QUANTIZED = ("llama", "qwen3_moe", "gpt_oss", "deepseek_v3", "gemma3_text", "qwen3_next", "mamba2")
HALF = ("llama", "qwen3", "gemma3_text", "lfm2", "mamba2")
HALF_CPU_ONLY = ("qwen3_moe", "deepseek_v3")  # mlx's CPU GatherMM is float32-only
SLOW = {"gemma3_text"}  # the slowest per case here (its rotating windows are snapshotted)
MAX_TOKENS = 12  # support.greedy's default, which kv_support's requests use


def cases() -> Iterator[object]:
    combos = [(f, "float32", p) for f in PATHS for p in ("cpu", "metal")]
    combos += [(f, "q4", p) for f in QUANTIZED for p in ("cpu", "metal")]
    combos += [(f, "bf16", p) for f in HALF for p in ("cpu", "metal")]
    combos += [(f, "bf16", "cpu") for f in HALF_CPU_ONLY]
    for family, dtype, path in combos:
        marks = [pytest.mark.slow_model] if family in SLOW else []
        yield pytest.param(family, dtype, path, id=f"{family}-{dtype}-{path}", marks=marks)


def served(family: str, dtype: str, tokenizer: object) -> LoadedModel:
    """The tiny model in `dtype`, prepared for the path WARMFLEET_ENGINE_PATH selects."""
    vocab = len(tokenizer)  # type: ignore[arg-type]
    model = tiny_random_model(vocab_size=vocab, arch=family)
    if dtype == "bf16":
        model.update(tree_map(lambda p: p.astype(mx.bfloat16), model.parameters()))
    elif dtype == "q4":
        model, _ = quantize_model(model, tiny_config(family, vocab), group_size=32, bits=4)
    gpu = on_gpu()
    model = for_path(model, gpu)
    return LoadedModel(model, tokenizer, family, f"tiny {family} {dtype}", 8192, gpu)  # type: ignore[arg-type]


@contextlib.contextmanager
def mlx_lm_functions(model: object) -> Iterator[None]:
    """mlx-lm's own attention and SwiGLU in the model's modules while the block runs
    (the engine rebinds them module-wide)."""
    swapped = []
    for module in attention.hook_modules(model):  # type: ignore[arg-type]
        hook = module.scaled_dot_product_attention
        swapped.append((module, "scaled_dot_product_attention", hook))
        module.scaled_dot_product_attention = getattr(hook, "__wrapped_sdpa__", hook)
    for layer in [model, *model.modules()]:  # type: ignore[attr-defined]
        module = sys.modules[type(layer).__module__]
        if getattr(module, "swiglu", None) is activation.swiglu:
            swapped.append((module, "swiglu", activation.swiglu))
            module.swiglu = activations.swiglu
    try:
        yield
    finally:
        for module, name, value in swapped:
            setattr(module, name, value)


def mlx_lm_greedy(loaded: LoadedModel, prompt: RenderedPrompt) -> list[int]:
    with mlx_lm_functions(loaded.model):
        out = stream_generate(
            loaded.model, loaded.tokenizer, prompt=list(prompt.tokens), max_tokens=MAX_TOKENS
        )
        return [r.token for r in out]


def short_prompt(seed: int, n: int) -> RenderedPrompt:
    rng = random.Random(seed)
    return RenderedPrompt(tuple(rng.randrange(100, 49000) for _ in range(n)), ())


@pytest.mark.parametrize(("family", "dtype", "path"), list(cases()))
def test_family(
    family: str, dtype: str, path: str, tiny: LoadedModel, tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setenv(ENGINE_PATH_ENV, "metal" if path == "metal" else "auto")
    loaded = served(family, dtype, tiny.tokenizer)
    assert loaded.on_gpu == (path == "metal")

    def engine() -> Engine:
        return Engine(loaded, EngineConfig(512 if loaded.on_gpu else 16, 1 << 30, 8))

    source = engine()
    expected_path = PATHS[family][loaded.on_gpu]
    assert source.decode_path.startswith(expected_path), source.decode_path

    prefix, full = prompts()
    others = [prompts(seed=6)[1], short_prompt(7, 9)]
    want = [mlx_lm_greedy(loaded, p) for p in (full, *others)]

    # 1, 2: mlx-lm's output from scratch, then from the warm prefix.
    assert [from_scratch(source, p) for p in (full, *others)] == want
    run(source, request(prefix.tokens, prefix.cuts, prefill_only=True, pin=True))
    assert answer(source, full) == (want[0], len(prefix.tokens))

    # 3: together, cold and with the prefix warm.
    together = [request(p.tokens, p.cuts) for p in (full, *others)]
    assert [tokens_of(e) for e in run(source, *together)] == want
    source.clear_prefix_cache()
    assert [tokens_of(e) for e in run(source, *together)] == want

    # 4: restored from a snapshot on disk, and copied from a warm peer.
    warm = warm_and_snapshot(source, tmp_path)
    restarted = engine()
    restore = KVTransfer(restarted, state_dir=tmp_path, snapshot_budget_bytes=64 << 20)
    assert restore.restorer.restore(prefix).tokens == len(prefix.tokens)
    assert answer(restarted, full) == (want[0], len(prefix.tokens))
    restore.stop()

    peer = Peer(warm)
    try:
        copy = engine()
        copying = KVTransfer(copy, warm_from=[peer.url])
        assert copying.restorer.restore(prefix).from_peers == len(copy.plan(prefix))
        assert answer(copy, full) == (want[0], len(prefix.tokens))
        copying.stop()
    finally:
        peer.close()


@pytest.mark.parametrize("family", QUANTIZED)
def test_the_cpu_path_computes_what_the_quantized_weights_do(family: str, tiny) -> None:
    """Loading on the CPU dequantizes every quantized layer (MLA's per-head matrices
    too, which mlx-lm's dequantize_model leaves) without changing what they compute."""
    vocab = len(tiny.tokenizer)
    quantized, _ = quantize_model(
        tiny_random_model(vocab_size=vocab, arch=family),
        tiny_config(family, vocab),
        group_size=32,
        bits=4,
    )
    tokens = mx.array([list(prompts()[1].tokens[:40])])
    with mlx_lm_functions(quantized):
        before = quantized(tokens)
        mx.eval(before)
        dense = for_path(quantized, gpu=False)
        after = dense(tokens)
    assert not any("scales" in m for _, m in dense.named_modules())
    assert mx.allclose(after, before, rtol=1e-3, atol=1e-3 * mx.abs(before).max().item()).item()


# -- served over HTTP, as a user would ------------------------------------------------

SYSTEM = {"role": "system", "content": "You are a terse assistant for a platform team."}
QUESTIONS = ["What is a Helm chart?", "Why cache prefixes?", "Name a Mac.", "Say hi.", "2+2?"]


@pytest.fixture(scope="module")
def deepseek_dir(tmp_path_factory: pytest.TempPathFactory, tiny: LoadedModel) -> Path:
    """A 4-bit tiny deepseek_v3 as an mlx-lm model directory."""
    vocab = len(tiny.tokenizer)
    model, config = quantize_model(
        tiny_random_model(vocab_size=vocab, arch="deepseek_v3"),
        tiny_config("deepseek_v3", vocab),
        group_size=32,
        bits=4,
    )
    return write_model_dir(tmp_path_factory.mktemp("deepseek_v3"), model, config, tiny.tokenizer)


def mlx_lm_chat(model: Any, tokenizer: Any, messages: list[dict[str, str]]) -> str:
    """mlx-lm's greedy reply, the prompt rendered as the daemon renders chats."""
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    tokens = tokenizer.encode(text, add_special_tokens=False)
    with mlx_lm_functions(model):
        return "".join(r.text for r in stream_generate(model, tokenizer, tokens, MAX_TOKENS))


@pytest.mark.slow_model
@pytest.mark.parametrize("path", ["cpu", "metal"])
def test_deepseek_v3_over_http_answers_what_mlx_lm_does(path: str, deepseek_dir: Path) -> None:
    metal = path == "metal"
    env = {ENGINE_PATH_ENV: "metal" if metal else "auto"}
    daemon = start_daemon("--model", str(deepseek_dir), "--log-level", "info", env=env)
    try:
        model, tokenizer = load(str(deepseek_dir))[:2]
        model = for_path(model, gpu=metal)  # the weights as the daemon runs them
        chats = [[SYSTEM, {"role": "user", "content": q}] for q in QUESTIONS]
        want = [mlx_lm_chat(model, tokenizer, chat) for chat in chats]

        def ask(messages: list[dict[str, str]]) -> tuple[str, int, int]:
            body = {"model": "default", "messages": messages, "temperature": 0}
            r = httpx.post(
                f"{daemon.url}/v1/chat/completions",
                json={**body, "max_tokens": MAX_TOKENS},
                timeout=120,
            )
            assert r.status_code == 200, r.text
            usage = r.json()["usage"]
            cached = usage["prompt_tokens_details"]["cached_tokens"]
            return r.json()["choices"][0]["message"]["content"], cached, usage["prompt_tokens"]

        text, cached, prompt_tokens = ask(chats[0])
        assert (text, cached) == (want[0], 0)
        assert ask(chats[0]) == (want[0], prompt_tokens, prompt_tokens)  # all of it cached
        with ThreadPoolExecutor(4) as pool:  # batched, the system prompt shared
            assert [t for t, _, _ in pool.map(ask, chats[1:])] == want[1:]
        layout = (
            "mlx-lm forward, attention per sequence" if metal else "batched rows, mlx-lm forward"
        )
        assert f"decode path for deepseek_v3: {layout}, latent attention (MLA)" in daemon.log()
    finally:
        daemon.stop()


def test_an_architecture_the_engine_cannot_serve_is_refused_at_start() -> None:
    app = create_app(DaemonSettings(model="tiny-random-deepseek_v41"))
    with serving(app) as url:
        deadline = time.monotonic() + 120
        while (ready := httpx.get(f"{url}/readyz", timeout=10)).json()["status"] == "loading":
            assert time.monotonic() < deadline, "still loading"
            time.sleep(0.1)
        assert ready.status_code == 503 and ready.json()["status"] == "failed"
        reason = "model architecture 'deepseek_v41' cannot be served by this engine"
        assert reason in ready.json()["error"]
        chat = {"model": "default", "messages": [{"role": "user", "content": "Hi"}]}
        r = httpx.post(f"{url}/v1/chat/completions", json=chat, timeout=10)
        assert r.status_code == 503, r.text
        assert r.json()["error"]["code"] == "model_load_failed"
        assert reason in r.json()["error"]["message"]


def test_the_readme_lists_every_family_with_its_paths() -> None:
    readme = (Path(__file__).resolve().parents[3] / "docs" / "serve.md").read_text()
    section = readme.split("### Model families and the path each takes")[1].split("\n#")[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    named = {name: row for row in rows for name in row.split("|")[1].split("`")[1::2]}
    cpu_words = {HAND_WRITTEN: "hand-written", ROWS: "mlx-lm forward", ONE_EACH: "per sequence"}
    for family, (cpu, metal) in PATHS.items():
        cells = named[family].split("|")
        assert cpu_words[cpu.removesuffix(MLA)] in cells[3], family
        assert ("latent" in cells[3]) == cpu.endswith(MLA), family
        assert ("one forward" in cells[4]) == (metal == ONE_EACH), family
