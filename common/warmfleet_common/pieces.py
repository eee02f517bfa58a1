"""Tokenizing what requests repeat once: a memo of the pieces between added tokens.

Hugging Face's `tokenizers` first cuts a text at its added tokens (the chat template's
`<|im_start|>`, `<|im_end|>`, ...) and encodes each piece between them on its own. For
tokenizers where that is all that links the pieces (no normalizer, byte-level or
digit/regex pre-tokenizers, added tokens without strip or word rules) a text can be cut
the same way and each piece's tokens remembered: a system prompt and a tool list that
every request repeats, and the head of the conversation that every probe rendering of
`PromptBuilder` repeats, are tokenized once. `PieceEncoder.of` checks such a tokenizer
against its own whole-text encoding on texts made to catch a difference, and gives None
for any other tokenizer (which then encodes whole texts, as before).
"""

from __future__ import annotations

import bisect
import json
import logging
import re
import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from typing import Any

log = logging.getLogger(__name__)

DEFAULT_MEMO_BYTES = 32 << 20
_NO_MORE = 1 << 62  # sorts after any token count at the same character offset
_PIECE_OVERHEAD = 120  # bytes of a memo entry besides its text and ids (dict, array)
_PRE_TOKENIZERS = {"ByteLevel", "Digits", "Split", "Punctuation", "Sequence"}
_CHECK_TEXTS = (
    "Hello world",
    "  leading and trailing spaces  ",
    "digits 1234567 and 3.14, unicode é ü 漢字 🙂, tabs\tand\nnew\n\nlines",
    "a\n\n\n",
    'tool: {"name": "run_tests", "arguments": {"path": "./..."}}',
)


class PieceEncoder:
    """`encode(text)` (no special tokens added) by memoized pieces; thread-safe."""

    def __init__(self, backend: Any, memo_bytes: int = DEFAULT_MEMO_BYTES) -> None:
        splitter = _splitter(backend)
        if splitter is None:
            raise ValueError("this tokenizer's pieces are not independent")
        self._backend = backend  # a tokenizers.Tokenizer
        self._splitter = splitter
        self._added = {t.content: i for i, t in backend.get_added_tokens_decoder().items()}
        self._memo: OrderedDict[str, array[int]] = OrderedDict()
        self._memo_bytes = 0
        self._memo_budget = memo_bytes
        self._lock = threading.Lock()  # prompts are built on several threads

    @classmethod
    def of(
        cls,
        tokenizer: Any,
        samples: Sequence[str] = (),
        memo_bytes: int = DEFAULT_MEMO_BYTES,
    ) -> PieceEncoder | None:
        """An encoder for `tokenizer` (anything with `encode(text, add_special_tokens=)`
        whose `backend_tokenizer` is a Rust `tokenizers.Tokenizer`: transformers' fast
        tokenizers, mlx-lm's wrapper of one) when it encodes exactly as the tokenizer
        does on the check texts and `samples` (e.g. a rendered chat); else None."""
        try:
            backend = tokenizer.backend_tokenizer
        except AttributeError:
            return None
        if not callable(getattr(backend, "encode_batch", None)):
            return None
        try:
            encoder = cls(backend, memo_bytes)
        except ValueError:
            return None

        def whole(text: str) -> list[int]:
            return list(tokenizer.encode(text, add_special_tokens=False))

        if not encoder._agrees(whole, samples):
            log.info("tokenizer pieces differ from whole texts; no piece memo")
            return None
        return encoder

    def encode(self, text: str) -> list[int]:
        return self.encode_marked(text, None)

    def encode_marked(self, text: str, marks: list[tuple[int, int]] | None) -> list[int]:
        """`encode(text)`, and into `marks` (when given) each added token's end: its
        character offset and the count of tokens up to it (`resume_point`)."""
        parts = self._splitter.split(text)  # text, added token, text, added token, ...
        pieces = [p for i, p in enumerate(parts) if i % 2 == 0 and p]
        with self._lock:
            missing = list(dict.fromkeys(p for p in pieces if p not in self._memo))
        if missing:  # encoded outside the lock: a long piece must not stall other threads
            encoded = self._backend.encode_batch(missing, add_special_tokens=False)
            with self._lock:
                for piece, encoding in zip(missing, encoded):
                    self._remember(piece, array("I", encoding.ids))
        out: list[int] = []
        at = 0
        for i, part in enumerate(parts):
            at += len(part)
            if i % 2:
                out.append(self._added[part])
                if marks is not None:
                    marks.append((at, len(out)))
            elif part:
                with self._lock:
                    ids = self._memo.get(part)
                    if ids is not None:
                        self._memo.move_to_end(part)
                if ids is None:  # evicted by a piece of this same text: encode again
                    ids = array("I", self._backend.encode(part, add_special_tokens=False).ids)
                out.extend(ids)
        return out

    def common_prefix(self, texts: Sequence[str]) -> tuple[int, list[int]]:
        """How many tokens every text's encoding starts with, and the first text's
        tokens up to there. The texts' shared head is cut at its last added token that
        no text can read differently (every match before it is decided within the shared
        characters), encoded once, and only the differing tails are encoded per text."""
        shared = _common_text(texts)
        cut = 0
        for match in self._splitter.matches(shared):
            if match.end() > len(shared) - self._splitter.longest:
                break
            cut = match.end()
        head = self.encode(shared[:cut])
        tails = [self.encode(t[cut:]) for t in texts]
        same = _common_length(tails)
        return len(head) + same, head + tails[0][:same]

    def resume_point(self, marks: Sequence[tuple[int, int]], same: int) -> tuple[int, int]:
        """Where to resume encoding a text whose first `same` characters are those of
        a text encoded with `marks`: the last added token's end that no text can read
        differently (as `common_prefix` cuts), and the tokens before it; (0, 0): none."""
        limit = same - self._splitter.longest
        found = bisect.bisect_right(marks, (limit, _NO_MORE)) - 1
        return marks[found] if found >= 0 else (0, 0)

    # -- helpers ----------------------------------------------------------------

    def _remember(self, piece: str, ids: array[int]) -> None:
        cost = len(piece) + 4 * len(ids) + _PIECE_OVERHEAD
        if cost > self._memo_budget // 4 or piece in self._memo:
            return  # one huge piece would push out everything else
        self._memo[piece] = ids
        self._memo_bytes += cost
        while self._memo_bytes > self._memo_budget:
            old, old_ids = self._memo.popitem(last=False)
            self._memo_bytes -= len(old) + 4 * len(old_ids) + _PIECE_OVERHEAD

    def _agrees(self, whole: Callable[[str], list[int]], samples: Sequence[str]) -> bool:
        """Pieces encode like whole texts on texts made to catch a difference."""
        texts = [*_CHECK_TEXTS, *samples]
        for token in list(self._added)[:8]:
            texts += [f"x{token}y", f" {token} ", f"{token}\n\n{token}", f"12{token}34"]
        try:
            return all(self.encode(t) == whole(t) for t in texts)
        except Exception as exc:  # a tokenizer that refuses a check text: no memo
            log.info("tokenizer piece check failed: %s", exc)
            return False


class _Splitter:
    def __init__(self, tokens: list[str]) -> None:
        ordered = sorted(tokens, key=len, reverse=True)  # leftmost-longest, as tokenizers
        self._pattern = re.compile("(" + "|".join(re.escape(t) for t in ordered) + ")")
        self.longest = len(ordered[0]) if ordered else 0

    def split(self, text: str) -> list[str]:
        return self._pattern.split(text)

    def matches(self, text: str, start: int = 0) -> Iterator[re.Match[str]]:
        return self._pattern.finditer(text, start)


def _common_text(texts: Sequence[str]) -> str:
    """The characters every text starts with."""
    low, high = min(texts), max(texts)
    return low[: shared_length(low, high)]


def shared_length(low: str | bytes, high: str | bytes) -> int:
    """How many items two strings (or byte strings) start with alike; with the least and
    greatest of a set, how many the whole set does. Bisection: slices compare in C, and
    only the window after what is known to agree is compared (linear in copied items)."""
    same, differ = 0, min(len(low), len(high)) + 1
    while differ - same > 1:
        middle = (same + differ) // 2
        if low[same:middle] == high[same:middle]:
            same = middle
        else:
            differ = middle
    return same


def _common_length(sequences: Sequence[Sequence[int]]) -> int:
    first, n = sequences[0], min(len(s) for s in sequences)
    for i in range(n):
        if any(s[i] != first[i] for s in sequences[1:]):
            return i
    return n


def _splitter(backend: Any) -> _Splitter | None:
    """A splitter at the added tokens when pieces are independent, else None."""
    try:
        config = json.loads(backend.to_str())
    except (ValueError, AttributeError, TypeError):
        return None
    if not isinstance(config, dict) or config.get("normalizer") is not None:
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
