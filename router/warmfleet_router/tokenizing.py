"""A daemon layout's tokenizer, with what the router needs besides encoding: the
vocabulary size as a daemon counts it (token ids past it are the daemons' 400) and the
bytes of its longest token (no text makes fewer tokens than bytes / that: a prompt too
long for every backend is refused before it is tokenized). Repeated text is tokenized
once by `PromptBuilder`'s piece memo (`warmfleet_common.pieces`), as on the daemons."""

from __future__ import annotations

from typing import Any

from warmfleet_common.cache_layout import CacheLayout, LayoutTokenizer


class FastLayoutTokenizer(LayoutTokenizer):
    def __init__(self, layout: CacheLayout) -> None:
        super().__init__(layout)
        hf: Any = self._hf
        self.vocab_size = len(hf)
        vocabulary = hf.get_vocab()
        # Byte-level vocabularies spell each byte as one character; others in UTF-8 (an
        # overestimate, which only loosens the size bound).
        byte_level = '"ByteLevel"' in hf.backend_tokenizer.to_str()
        self.max_token_bytes = max(
            (len(t) if byte_level else len(t.encode("utf-8")) for t in vocabulary), default=1
        )
