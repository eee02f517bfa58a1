"""How a daemon turns a request into cache block keys, as a document a router can load.

The router must compute exactly the keys the daemon's engine computes: the same chat
template (with the same extra template arguments), the same tokenizer, the same chunk
size and the same root key. The daemon serves all of that on `GET /v1/cache/layout`
(the Hugging Face tokenizer files as `save_pretrained` writes them), so a router in a
cluster needs no model files and follows whatever model each daemon serves. Plain
Python and pydantic (no mlx): the router imports it.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from warmfleet_common.rendering import FastRenderer, plain_messages
from warmfleet_common.tiers import TierCosts


class CacheLayout(BaseModel):
    """Everything that decides a request's block keys on one daemon."""

    fingerprint: str = Field(description="digest of every other field but costs")
    model: str
    root: str = Field(description="hex root key of the block chains (one per model)")
    block_size: int = Field(ge=1)
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)
    # A Python renderer in place of the Jinja template: a router cannot reproduce it.
    custom_renderer: bool = False
    tokenizer_files: dict[str, str] = Field(default_factory=dict)
    # Not in the fingerprint: costs differ per machine, keys do not (None: an older daemon).
    costs: TierCosts | None = None


def fingerprint_of(
    *,
    model: str,
    root: str,
    block_size: int,
    chat_template_kwargs: Mapping[str, Any],
    custom_renderer: bool,
    tokenizer_files: Mapping[str, str],
) -> str:
    digest = hashlib.blake2b(digest_size=16)
    digest.update(
        json.dumps(
            [model, root, block_size, dict(chat_template_kwargs), custom_renderer],
            sort_keys=True,
            default=str,
        ).encode()
    )
    for name in sorted(tokenizer_files):
        digest.update(name.encode() + b"\0" + tokenizer_files[name].encode() + b"\0")
    return digest.hexdigest()


def export_layout(tokenizer: Any, *, model: str, root: bytes, block_size: int) -> CacheLayout:
    """The layout of a daemon whose prompts go through `tokenizer` (an mlx-lm
    TokenizerWrapper around a Hugging Face tokenizer)."""
    hf = getattr(tokenizer, "_tokenizer", tokenizer)
    files: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="warmfleet-layout-") as tmp:
        hf.save_pretrained(tmp)
        for path in sorted(Path(tmp).iterdir()):
            if path.is_file():
                files[path.name] = path.read_text(encoding="utf-8")
    # mlx-lm passes the "thinking" switch to every template render; so must the router.
    thinking_kwarg = getattr(tokenizer, "_thinking_kwarg", None)
    kwargs: dict[str, Any] = {}
    if thinking_kwarg:
        kwargs[str(thinking_kwarg)] = bool(getattr(tokenizer, "has_thinking", False))
    custom = getattr(tokenizer, "_chat_template", None) is not None
    fields: dict[str, Any] = {
        "model": model,
        "root": root.hex(),
        "block_size": block_size,
        "chat_template_kwargs": kwargs,
        "custom_renderer": custom,
        "tokenizer_files": files,
    }
    return CacheLayout(fingerprint=fingerprint_of(**fields), **fields)


class LayoutTokenizer:
    """A tokenizer rebuilt from a layout's files that renders chats exactly as mlx-lm's
    TokenizerWrapper does for the daemon (the duck type `PromptBuilder` takes)."""

    def __init__(self, layout: CacheLayout) -> None:
        from transformers import AutoTokenizer  # heavy: only when a layout is loaded

        if layout.custom_renderer:
            raise ValueError(f"model {layout.model!r} renders chats in Python; cannot reproduce")
        with tempfile.TemporaryDirectory(prefix="warmfleet-layout-") as tmp:
            for name, text in layout.tokenizer_files.items():
                if os.sep in name or name.startswith("."):
                    raise ValueError(f"unexpected tokenizer file name {name!r}")
                Path(tmp, name).write_text(text, encoding="utf-8")
            self._hf = AutoTokenizer.from_pretrained(tmp)
        self._kwargs = dict(layout.chat_template_kwargs)
        self.chat_template = getattr(self._hf, "chat_template", None)
        self._fast = FastRenderer.checked(self._hf, self._kwargs) if self.chat_template else None

    @property
    def backend_tokenizer(self) -> Any:
        """The Rust `tokenizers.Tokenizer` (what `PieceEncoder` cuts texts for)."""
        return self._hf.backend_tokenizer

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self._hf.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, tokens: Sequence[int]) -> str:
        return str(self._hf.decode(list(tokens)))

    def apply_chat_template(self, messages: Any, **kwargs: Any) -> Any:
        if self._fast is not None and kwargs.get("tokenize") is False and plain_messages(messages):
            kwargs.pop("tokenize")
            return self._fast.render(messages, **kwargs)
        for key, value in self._kwargs.items():
            kwargs.setdefault(key, value)
        kwargs["return_dict"] = False
        return self._hf.apply_chat_template(messages, **kwargs)
