"""The piece memo tokenizes exactly as the tokenizer does, and a prompt built with it is
the prompt built without it (tokens and cuts), on the embedded model's tokenizer."""

from __future__ import annotations

import json
from typing import Any

import pytest

from warmfleet_common.pieces import PieceEncoder
from warmfleet_common.prompts import PromptBuilder
from warmfleet_daemon.models.loader import load_gguf_tokenizer_only

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": f"tool_{i}",
            "description": "Runs a command in the shell.\n\n  Usage:\n - quote paths with spaces",
            "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
        },
    }
    for i in range(12)
]
TEXTS = [
    "",
    "plain words",
    "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\n  hi<|im_end|>\n",
    "<|im_start|><|im_start|>x<|im_end|><|im_end|>",
    "no space<|im_end|>after\n\n\n<|im_start|> \t lead",
    "digits 12345678901234567890 ü 漢字 🙂 \r\n tabs\t\t and <|endoftext|>!",
    json.dumps(TOOLS),
]


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return load_gguf_tokenizer_only()


class WholeTexts:
    """The tokenizer without a Rust backend to cut for: PromptBuilder encodes whole texts."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        if name == "backend_tokenizer":
            raise AttributeError(name)
        return getattr(self._inner, name)


def test_pieces_encode_as_the_tokenizer_does(tokenizer: Any) -> None:
    pieces = PieceEncoder.of(tokenizer, memo_bytes=4096)  # small: evictions happen too
    assert pieces is not None
    for _ in range(2):  # encoded, then from the memo
        for text in TEXTS:
            assert pieces.encode(text) == list(tokenizer.encode(text, add_special_tokens=False))


def test_a_prompt_is_the_same_with_and_without_the_memo(tokenizer: Any) -> None:
    memo, whole = PromptBuilder(tokenizer), PromptBuilder(WholeTexts(tokenizer))
    assert memo._pieces is not None and whole._pieces is None
    system = {"role": "system", "content": "You are an agent.\n" + "Rules: be brief. " * 300}
    conversation = [
        system,
        {"role": "user", "content": " Fix the build"},
        {"role": "assistant", "content": "\nRunning tests."},
        {"role": "user", "content": "1. then commit"},
    ]
    for messages in (conversation[:2], conversation):
        a, b = memo.chat(messages, TOOLS), whole.chat(messages, TOOLS)
        assert (a.tokens, a.cuts, a.message_starts, a.reply_start) == (
            b.tokens,
            b.cuts,
            b.message_starts,
            b.reply_start,
        )
    assert memo.shared_prefix([system], TOOLS) == whole.shared_prefix([system], TOOLS)


def test_a_tokenizer_whose_pieces_are_not_independent_gets_no_memo() -> None:
    class Backend:
        def to_str(self) -> str:
            return json.dumps({"normalizer": {"type": "NFC"}, "pre_tokenizer": None})

        def encode_batch(self, *_: Any, **__: Any) -> Any:
            raise AssertionError("not used")

    class Tokenizer:
        backend_tokenizer = Backend()

    assert PieceEncoder.of(Tokenizer()) is None


def test_the_common_prefix_of_texts_is_that_of_their_encodings(tokenizer: Any) -> None:
    pieces = PieceEncoder.of(tokenizer)
    assert pieces is not None
    head = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>assistant\n"
    cases = [
        [head + p + "<|im_end|>\n" for p in ("x", " x", "\n\nx", "1", "éx")],
        [head + "<|im_end|>", head + "<|im_start|>", head + "<|im_"],  # differ inside a token
        ["<|im_start|>", "<|im_start|>user", "<|im_start|>"],
        ["same text", "same text"],
        ["a", "b"],
    ]
    for texts in cases:
        encoded = [list(tokenizer.encode(t, add_special_tokens=False)) for t in texts]
        common = next(
            (i for i in range(min(map(len, encoded))) if len({e[i] for e in encoded}) > 1),
            min(map(len, encoded)),
        )
        assert pieces.common_prefix(texts) == (common, encoded[0][:common]), texts
