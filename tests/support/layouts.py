"""A daemon cache layout with a made-up byte-level tokenizer and a ChatML template: what
a router needs to key requests, without a model (for fake backends)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from warmfleet_common.cache_layout import CacheLayout, fingerprint_of
from warmfleet_common.chunking import root_key

TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def tiny_layout(block_size: int = 4, model: str = "m") -> CacheLayout:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<|im_start|>": 1, "<|im_end|>": 2}
    for ch in "abcdefghijklmnopqrstuvwxyz0123456789ĠĊ.,!?":
        vocab.setdefault(ch, len(vocab))
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token="<unk>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
    )
    fast.chat_template = TEMPLATE
    with tempfile.TemporaryDirectory() as tmp:
        fast.save_pretrained(tmp)
        files = {p.name: p.read_text(encoding="utf-8") for p in Path(tmp).iterdir()}
    fields = {
        "model": model,
        "root": root_key(model).hex(),
        "block_size": block_size,
        "chat_template_kwargs": {},
        "custom_renderer": False,
        "tokenizer_files": files,
    }
    return CacheLayout(fingerprint=fingerprint_of(**fields), **fields)  # type: ignore[arg-type]
