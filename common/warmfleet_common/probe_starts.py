"""A message's content start (`PromptBuilder._content_start`) with the probes' shared
head taken from the request's own tokens.

The probes' renderings share the conversation before the message's content; the whole
path tokenizes that head again (its pieces are memoized, but gathered and hashed in full)
for every new cut, twice a turn. When the head, up to the last added token no probe can
read differently, is the request's own text up to one of its added tokens, its tokens
are the request's up to there (the same piece encoding: `pieces.resume_point`), and
its digest continues a running digest of the request's tokens. Anything else (another
template, a memo hit, an error) is left to `PromptBuilder._content_start` itself.
"""

from __future__ import annotations

import bisect
import hashlib
import sys
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from warmfleet_common.pieces import PieceEncoder, _common_length, shared_length
from warmfleet_common.prompts import Message, PromptBuilder, PromptError
from warmfleet_common.verbatim import probe_texts


@dataclass(frozen=True)
class Known:
    """The request being keyed: its text, tokens, added tokens' ends (character, tokens
    before) and running digests of its leading tokens (count, blake2b)."""

    text: str
    tokens: array[int]
    marks: Sequence[tuple[int, int]]
    hashers: Sequence[tuple[int, Any]]


def content_start(
    builder: PromptBuilder,
    chat: Sequence[Message],
    index: int,
    tools: Sequence[Mapping[str, Any]] | None,
    kwargs: Mapping[str, Any],
    key: bytes,
    known: Known,
) -> tuple[int, bytes] | None:
    """What `builder._content_start(chat, index, tools, kwargs, key)` gives."""
    pieces = builder._pieces
    with builder._memo_lock:
        memoized = key in builder._content_starts
    if pieces is None or memoized or not builder._inserts_verbatim(tools, kwargs):
        return builder._content_start(chat, index, tools, kwargs, key)
    try:
        texts = probe_texts(
            lambda m: builder._render(m, tools, False, kwargs),
            list(chat[:index]),
            chat[index].get("role"),
        )
        if texts is None:
            raise _Unknown
        return _from_known(pieces, texts, known)
    except (_Unknown, PromptError, TypeError, ValueError):  # the whole path decides
        return builder._content_start(chat, index, tools, kwargs, key)


class _Unknown(Exception):
    """The probes' shared head is not the known request's."""


def _from_known(pieces: PieceEncoder, texts: list[str], known: Known) -> tuple[int, bytes] | None:
    """`PieceEncoder.common_prefix(texts)`'s count and digest (None: no cut), from the
    known tokens."""
    shared = texts[0][: shared_length(min(texts), max(texts))]
    for text in {texts[0][: len(shared)], *(t[len(shared) :] for t in texts)}:
        text.encode("utf-8")  # a lone surrogate: the whole path's PromptError
    # The head's added tokens are the known text's as far as both agree (`resume_point`),
    # so only the rest is scanned for the last one no probe can read differently.
    limit = len(shared) - pieces._splitter.longest
    cut, _ = pieces.resume_point(known.marks, shared_length(shared, known.text))
    for match in pieces._splitter.matches(shared, cut):
        if match.end() > limit:
            break
        cut = match.end()
    at = bisect.bisect_left(known.marks, (cut, -1))
    if not cut or at == len(known.marks) or known.marks[at][0] != cut:
        raise _Unknown
    if shared_length(shared[:cut], known.text[:cut]) != cut:
        raise _Unknown
    count = known.marks[at][1]
    tails = [pieces.encode(t[cut:]) for t in texts]
    same = _common_length(tails)
    common = count + same
    if not common:
        return None
    start = max(((c, h) for c, h in known.hashers if c <= count), default=None, key=_count)
    running, done = (start[1].copy(), start[0]) if start else (hashlib.blake2b(digest_size=16), 0)
    running.update(wide(known.tokens[done:count]))
    running.update(array("q", tails[0][:same]).tobytes())
    return common, running.digest()


def wide(tokens: array[int]) -> bytes | bytearray:
    """`array("q", tokens).tobytes()` (how `prompts` digests tokens) of an "I" array:
    on a little-endian machine each id's four bytes then four zeros, copied in C (the
    conversion item by item cost 0.7 ms for 13k tokens)."""
    if sys.byteorder != "little" or tokens.itemsize != 4:
        return array("q", tokens).tobytes()
    narrow = tokens.tobytes()
    out = bytearray(2 * len(narrow))
    for byte in range(4):
        out[byte::8] = narrow[byte::4]
    return out


def _count(pair: tuple[int, Any]) -> int:
    return pair[0]
