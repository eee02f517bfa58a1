"""A daemon layout's tokenizer, fast on the text requests repeat.

Hugging Face's `tokenizers` first cuts a text at its added tokens (the chat template's
`<|im_start|>`, `<|im_end|>`, ...) and encodes each piece between them on its own. For
tokenizers where that is all that links the pieces (no normalizer, byte-level or
digit/regex pre-tokenizers, added tokens without strip or word rules) the router cuts
the text the same way and remembers each piece's tokens: a system prompt and a tool
list that every request repeats are tokenized once. Such a tokenizer is checked at load
against whole-text encoding on texts made to catch a difference; any other tokenizer,
or one that fails the check, encodes whole texts as the daemon does.
"""

from __future__ import annotations

import json
import logging
import re
from array import array
from collections import OrderedDict
from typing import Any

from warmfleet_common.cache_layout import CacheLayout, LayoutTokenizer

log = logging.getLogger(__name__)

DEFAULT_MEMO_BYTES = 32 << 20
_PRE_TOKENIZERS = {"ByteLevel", "Digits", "Split", "Punctuation", "Sequence"}
_CHECK_TEXTS = (
    "Hello world",
    "  leading and trailing spaces  ",
    "digits 1234567 and 3.14, unicode é ü 漢字 🙂, tabs\tand\nnew\n\nlines",
    "a\n\n\n",
    'tool: {"name": "run_tests", "arguments": {"path": "./..."}}',
)


class FastLayoutTokenizer(LayoutTokenizer):
    def __init__(self, layout: CacheLayout, memo_bytes: int = DEFAULT_MEMO_BYTES) -> None:
        super().__init__(layout)
        hf: Any = self._hf
        self._backend = hf.backend_tokenizer  # the Rust tokenizers.Tokenizer
        self.vocab_size = len(hf)
        vocabulary = hf.get_vocab()
        # Byte-level vocabularies spell each byte as one character; others in UTF-8 (an
        # overestimate, which only loosens the size bound).
        byte_level = '"ByteLevel"' in self._backend.to_str()
        self.max_token_bytes = max(
            (len(t) if byte_level else len(t.encode("utf-8")) for t in vocabulary), default=1
        )
        self._memo: OrderedDict[str, array[int]] = OrderedDict()
        self._memo_bytes = 0
        self._memo_budget = memo_bytes
        self._added = {t.content: i for i, t in self._backend.get_added_tokens_decoder().items()}
        self._splitter = _splitter(self._backend)
        if self._splitter is not None and not self._agrees():
            log.info("tokenizer of %s: pieces differ from whole texts; no piece memo", layout.model)
            self._splitter = None

    @property
    def segmented(self) -> bool:
        return self._splitter is not None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if add_special_tokens or self._splitter is None:
            return super().encode(text, add_special_tokens)
        return self._segmented(text)

    def _segmented(self, text: str) -> list[int]:
        assert self._splitter is not None
        parts = self._splitter.split(text)  # text, added token, text, added token, ...
        pieces = [p for i, p in enumerate(parts) if i % 2 == 0 and p]
        missing = list(dict.fromkeys(p for p in pieces if p not in self._memo))
        if missing:
            encoded = self._backend.encode_batch(missing, add_special_tokens=False)
            for piece, encoding in zip(missing, encoded):
                self._remember(piece, array("I", encoding.ids))
        out: list[int] = []
        for i, part in enumerate(parts):
            if i % 2:
                out.append(self._added[part])
            elif part:
                ids = self._memo.get(part)
                if ids is None:  # evicted by a piece of this same text: encode again
                    ids = array("I", self._backend.encode(part, add_special_tokens=False).ids)
                else:
                    self._memo.move_to_end(part)
                out.extend(ids)
        return out

    def _remember(self, piece: str, ids: array[int]) -> None:
        cost = len(piece) + 4 * len(ids) + 120
        if cost > self._memo_budget // 4:
            return  # one huge piece would push out everything else
        self._memo[piece] = ids
        self._memo_bytes += cost
        while self._memo_bytes > self._memo_budget:
            old, old_ids = self._memo.popitem(last=False)
            self._memo_bytes -= len(old) + 4 * len(old_ids) + 120

    def _agrees(self) -> bool:
        """Pieces encode like whole texts on texts made to catch a difference."""
        added = list(self._added)
        texts = list(_CHECK_TEXTS)
        for token in added[:8]:
            texts += [f"x{token}y", f" {token} ", f"{token}\n\n{token}", f"12{token}34"]
        try:
            rendered = self.apply_chat_template(
                [
                    {"role": "system", "content": " You are terse. "},
                    {"role": "user", "content": "Hi 42!\n"},
                    {"role": "assistant", "content": "  Hello."},
                    {"role": "user", "content": "é\t漢"},
                ],
                tokenize=False,
                add_generation_prompt=True,
            )
            texts.append(str(rendered))
        except Exception as exc:  # a template that wants other roles: the rest still check
            log.debug("chat template sample not rendered: %s", exc)
        return all(
            self._segmented(t) == list(super(FastLayoutTokenizer, self).encode(t, False))
            for t in texts
        )


class _Splitter:
    def __init__(self, tokens: list[str]) -> None:
        ordered = sorted(tokens, key=len, reverse=True)  # leftmost-longest, as tokenizers
        self._pattern = re.compile("(" + "|".join(re.escape(t) for t in ordered) + ")")

    def split(self, text: str) -> list[str]:
        return self._pattern.split(text)


def _splitter(backend: Any) -> _Splitter | None:
    """A splitter at the added tokens when pieces are independent, else None."""
    try:
        config = json.loads(backend.to_str())
    except (ValueError, AttributeError):
        return None
    if config.get("normalizer") is not None:
        return None
    if not _independent_pre_tokenizer(config.get("pre_tokenizer")):
        return None
    added = config.get("added_tokens") or []
    if not added or any(t.get("lstrip") or t.get("rstrip") or t.get("single_word") for t in added):
        return None
    return _Splitter([t["content"] for t in added if t.get("content")])


def _independent_pre_tokenizer(config: Any) -> bool:
    if not isinstance(config, dict) or config.get("type") not in _PRE_TOKENIZERS:
        return False
    if config["type"] == "Sequence":
        return all(_independent_pre_tokenizer(p) for p in config.get("pretokenizers") or [])
    if config["type"] == "ByteLevel":
        return not config.get("add_prefix_space", False)
    return True
