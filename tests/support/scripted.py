"""A scripted model: a real model object for the engine (it keeps a KV cache, so prefill
chunks, the prefix cache and batching all run) whose next token is read from a script.

The KV cache holds the token ids themselves, so the model sees the whole history on
every call: it finds the chat's generation prompt and emits `script[k]` for the k-th
token after it, then EOS. Tokens outside the script get `fallback` logits (0 unless
set), which is what a grammar mask chooses from when it forbids the scripted token.

A list of scripts is one per assistant turn: the n-th assistant turn of the history
(counted by its `<|im_start|>assistant` headers) says `scripts[n]` (the last one from
there on), e.g. a tool call first and then text once the tool's result is in. For
templates whose replies start messages of their own with the generation prompt
(harmony's `<|start|>assistant`), `turns_after` names what opens a user message or a
tool result: the reply starts at the first generation prompt after the last of them,
and the n-th of them is answered by `scripts[n - 1]`. Every
prompt the model is asked to continue is kept in `prompts` (token ids): what the
daemon made of each request.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import KVCache

from support.processes import serving
from warmfleet_daemon.api.app import create_app
from warmfleet_daemon.engine.core import Engine
from warmfleet_daemon.engine.requests import EngineConfig
from warmfleet_daemon.models.loader import LoadedModel
from warmfleet_daemon.settings import DaemonSettings

NAME = "scripted"


class ScriptedModel:
    def __init__(
        self,
        tokenizer: Any,
        script: str | Sequence[str],
        fallback: dict[str, float] | None = None,
        *,
        marker: str = "<|im_start|>assistant\n",
        turns_after: Sequence[str] = (),
    ):
        self.vocab_size = len(tokenizer)
        self.marker = tuple(tokenizer.encode(marker, add_special_tokens=False))
        self.turns_after = [
            tuple(tokenizer.encode(t, add_special_tokens=False)) for t in turns_after
        ]
        self.eos = min(tokenizer.eos_token_ids)
        turns = [script] if isinstance(script, str) else list(script)
        self.scripts = [list(tokenizer.encode(t, add_special_tokens=False)) for t in turns]
        self.prompts: list[list[int]] = []
        bias = [0.0] * self.vocab_size
        for text, value in (fallback or {}).items():
            for token in tokenizer.encode(text, add_special_tokens=False):
                bias[token] = value
        self._fallback = mx.array(bias)

    def make_cache(self) -> list[KVCache]:
        return [KVCache()]

    def parameters(self) -> dict[str, Any]:
        return {}  # no weights: what it says is its script (mlx-lm models are nn.Modules)

    def next_token(self, history: list[int]) -> int:
        m = len(self.marker)
        starts = _found(history, self.marker)
        turn = len(starts) - 1
        if self.turns_after:
            opened = sorted(i + len(t) for t in self.turns_after for i in _found(history, t))
            after = opened[-1] if opened else 0
            starts = [i for i in starts if i >= after][:1]
            turn = len(opened) - 1
        k = len(history) - (starts[-1] + m) if starts else 0
        if k == 0 and starts:
            self.prompts.append(history)
        script = self.scripts[min(max(turn, 0), len(self.scripts) - 1)]
        return script[k] if k < len(script) else self.eos

    def __call__(self, inputs: mx.array, cache: list[KVCache] | None = None) -> mx.array:
        batch, length = inputs.shape
        assert batch == 1 and cache is not None
        ids = inputs.astype(mx.float32).reshape(1, 1, length, 1)
        keys, _ = cache[0].update_and_fetch(ids, ids)
        history = [int(t) for t in keys[0, 0, :, 0].tolist()]
        row = self._fallback + 20.0 * (mx.arange(self.vocab_size) == self.next_token(history))
        return mx.broadcast_to(row, (1, length, self.vocab_size))


def _found(history: list[int], sequence: tuple[int, ...]) -> list[int]:
    n = len(sequence)
    return [i for i in range(len(history) - n + 1) if tuple(history[i : i + n]) == sequence]


def scripted_engine(tokenizer: Any, script: str | Sequence[str], **kw: Any) -> Engine:
    model = ScriptedModel(tokenizer, script, **kw)
    loaded = LoadedModel(model, tokenizer, NAME, "a script", 8192, False)  # type: ignore[arg-type]
    return Engine(loaded, EngineConfig(block_size=32, cache_budget_bytes=1 << 26))


@contextmanager
def serve(engine: Engine, **settings_: Any) -> Iterator[str]:
    """The daemon's app on a real HTTP port (uvicorn in a thread); yields its base URL."""
    # Greedy unless a request says otherwise: what a mask leaves is chosen deterministically.
    settings = DaemonSettings(model=NAME, default_temperature=0.0, **settings_)
    with serving(create_app(settings, engine=engine)) as url:
        yield url


class Recorder:
    """An ASGI app in front of `app` that keeps the path and JSON body of every POST it
    passes on: what a client really sent."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.requests: list[tuple[str, Any]] = []

    def bodies(self, path: str) -> list[Any]:
        return [body for p, body in self.requests if p == path]

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            return await self.app(scope, receive, send)
        chunks: list[bytes] = []

        async def recording() -> Any:
            message = await receive()
            if message["type"] == "http.request":
                chunks.append(message.get("body", b""))
                if not message.get("more_body"):
                    try:
                        self.requests.append((scope["path"], json.loads(b"".join(chunks))))
                    except ValueError:
                        self.requests.append((scope["path"], None))
            return message

        await self.app(scope, recording, send)
