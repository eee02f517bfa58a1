"""Structured output: token masks from llguidance, one matcher per sequence.

llguidance rather than xgrammar or outlines-core: it has no Python dependencies
(xgrammar pulls in torch), ships abi3 wheels for Linux x86_64 and macOS arm64, builds its
tokenizer from the Hugging Face fast tokenizer that mlx-lm wraps, and compiles JSON
schemas and Lark grammars (tool calls) lazily, with no per-schema index to build.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import llguidance
import llguidance.hf
import mlx.core as mx
import numpy as np

from warmfleet_daemon.engine.finite_schema import no_finite_instance

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions

# The JSON the model is made to write: one line, with the separators of Python's
# json.dumps (what chat models imitate); flexible whitespace lets a model pad forever.
JSON_OPTIONS: JsonCompileOptions = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
}


_FORCED_PROBE_TOKENS = 16  # checked before a grammar is accepted (GrammarCompiler.check)


class GrammarError(ValueError):
    """The schema or grammar cannot be compiled."""


def json_schema_grammar(schema: dict[str, Any]) -> str:
    """An llguidance grammar for documents valid under `schema`."""
    endless = no_finite_instance(schema)
    if endless is not None:
        raise GrammarError(endless)
    try:
        return str(llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS))
    except ValueError as exc:
        raise GrammarError(str(exc)) from exc


def lark_grammar(lark: str) -> str:
    return str(llguidance.LLMatcher.grammar_from_lark(lark))


class GrammarCompiler:
    """The model's tokenizer as llguidance sees it (built on first use: ~1 s)."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer  # an mlx-lm TokenizerWrapper
        self._ll: Any = None
        self._lock = threading.Lock()

    @property
    def ll_tokenizer(self) -> Any:
        with self._lock:
            if self._ll is None:
                hf = getattr(self._tokenizer, "_tokenizer", self._tokenizer)
                eos = sorted(self._tokenizer.eos_token_ids)
                self._ll = llguidance.hf.from_tokenizer(hf, eos_token=eos)
            return self._ll

    def check(self, grammar: str) -> None:
        """Raise GrammarError unless `grammar` compiles for this tokenizer and its
        forced start can be produced."""
        error = llguidance.LLMatcher.validate_grammar(grammar, self.ll_tokenizer)
        if error:
            raise GrammarError(error)
        # A start the grammar forces without end fails only once a token is taken
        # ("Too many items"): take the forced ones now, not in a failed generation.
        matcher = llguidance.LLMatcher(self.ll_tokenizer, grammar, log_level=0)
        for _ in range(_FORCED_PROBE_TOKENS):
            allowed = _allowed(matcher)
            if matcher.is_error() or allowed.size != 1 or matcher.is_stopped():
                break
            matcher.consume_token(int(allowed[0]))
        if matcher.is_error():
            raise GrammarError(matcher.get_error().splitlines()[0])

    def mask(self, grammar: str) -> TokenMask:
        matcher = llguidance.LLMatcher(self.ll_tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise GrammarError(matcher.get_error())
        return TokenMask(matcher)

    def token_bytes(self, token: int) -> bytes:
        """The exact bytes of one token (special tokens as their text)."""
        return bytes(self.ll_tokenizer.decode_bytes([token]))


def _allowed(matcher: Any) -> np.ndarray[Any, Any]:
    """The token ids `matcher` allows next."""
    words = np.frombuffer(matcher.compute_bitmask(), dtype=np.uint8)
    return np.flatnonzero(np.unpackbits(words, bitorder="little"))


class TokenMask:
    """One sequence's grammar state: which tokens may come next."""

    def __init__(self, matcher: Any) -> None:
        self._matcher = matcher

    def apply(self, logits: mx.array) -> mx.array:
        """Disallowed tokens of a (1, vocab) row to -inf. (llguidance.mlx's kernel is
        Metal-only; this runs on the CPU build too.)"""
        words = np.frombuffer(self._matcher.compute_bitmask(), dtype=np.uint8)
        allowed = np.unpackbits(words, bitorder="little").astype(bool)
        vocab = logits.shape[-1]
        if allowed.size < vocab:  # rows past the tokenizer's vocabulary (padding)
            allowed = np.concatenate([allowed, np.zeros(vocab - allowed.size, dtype=bool)])
        return mx.where(mx.array(allowed[:vocab])[None], logits, -mx.inf)

    def accept(self, token: int) -> bool:
        """Advance past a sampled token; False if the grammar did not allow it."""
        return bool(self._matcher.consume_token(token))

    @property
    def error(self) -> str | None:
        return str(self._matcher.get_error()) if self._matcher.is_error() else None
