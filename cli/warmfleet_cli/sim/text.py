"""Deterministic pseudo-text: prose and code-like lines of a given length, drawn from a
generator seeded by a key, so the same key always gives the same characters (on any
machine and Python version: `random.Random` seeded with an int and `random()` are
stable) and two keys share nothing but the vocabulary."""

from __future__ import annotations

import hashlib
import random
import uuid

from warmfleet_cli.sim.population import CHARS_PER_TOKEN

WORDS = [
    "the",
    "a",
    "of",
    "to",
    "and",
    "in",
    "is",
    "for",
    "that",
    "with",
    "on",
    "as",
    "it",
    "be",
    "are",
    "this",
    "by",
    "from",
    "or",
    "an",
    "can",
    "not",
    "file",
    "function",
    "value",
    "return",
    "request",
    "response",
    "cache",
    "prefix",
    "token",
    "model",
    "server",
    "test",
    "error",
    "config",
    "path",
    "line",
    "session",
    "agent",
    "tool",
    "result",
    "output",
    "input",
    "build",
    "run",
    "check",
    "use",
    "when",
    "each",
    "must",
    "should",
    "will",
    "if",
    "then",
    "else",
    "only",
    "all",
    "any",
    "new",
    "old",
    "first",
    "last",
    "next",
    "list",
    "map",
    "set",
    "key",
    "name",
    "type",
    "data",
    "block",
    "node",
    "fleet",
    "warm",
    "cold",
    "time",
    "count",
    "size",
    "limit",
    "read",
    "write",
    "open",
    "close",
    "start",
    "stop",
    "load",
    "save",
    "parse",
    "render",
    "format",
    "update",
    "delete",
    "user",
    "system",
    "message",
    "content",
    "text",
    "string",
    "number",
    "object",
    "array",
    "field",
    "option",
    "default",
    "because",
    "before",
    "after",
    "while",
    "until",
    "where",
    "which",
    "what",
    "how",
    "why",
    "into",
    "over",
    "under",
    "about",
]
IDENTS = [
    "config",
    "request_id",
    "cache_entry",
    "prefix_len",
    "block_keys",
    "session",
    "node_count",
    "warm_set",
    "tokens",
    "result",
    "path",
    "handler",
    "router",
    "backend",
    "status",
    "budget",
    "index",
    "queue",
    "worker",
    "chunk",
    "offset",
    "limit",
    "timeout",
    "retries",
    "payload",
    "headers",
    "body",
    "stream",
    "reply",
    "items",
    "total",
]
CODE = (
    "def {a}({b}, {c}):",
    "    return {a}[{n}] + {b}",
    "    if {a} is None:",
    '        raise ValueError(f"{a}: {{{b}!r}}")',
    "    for {a} in {b}:",
    '        {a} = {b}.get("{c}", {n})',
    "{a} = {b}({c}={n})",
    "    assert {a} == {b}, {c}",
    "import {a}",
    "class {A}({B}):",
    "    self.{a} = {b}",
    "    {a}.append({b}[{n}:{n}])",
    "ERROR {a}: {b} failed after {n} ms ({c})",
    "  {n} | {a}.{b}({c})",
)


def key_int(*parts: object) -> int:
    """A 64-bit integer from `parts` (stable: blake2b, not Python's salted hash)."""
    text = "\x1f".join(str(p) for p in parts)
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


def stable_uuid(*parts: object) -> str:
    """A UUID-shaped id from `parts` (version 4 bits set, not random)."""
    digest = hashlib.blake2b("\x1f".join(str(p) for p in parts).encode(), digest_size=16)
    return str(uuid.UUID(bytes=digest.digest(), version=4))


def chars(tokens: int) -> int:
    return max(1, round(tokens * CHARS_PER_TOKEN))


def text(key: str, n_chars: int, code_share: float = 0.3) -> str:
    """`n_chars` characters of lines, prose or (with probability `code_share`) code."""
    rng = random.Random(key_int("text", key))
    pick = rng.random
    out: list[str] = []
    size = 0
    while size < n_chars:
        if pick() < code_share:
            template = CODE[int(pick() * len(CODE))]
            a, b, c = (IDENTS[int(pick() * len(IDENTS))] for _ in range(3))
            line = template.format(
                a=a, b=b, c=c, n=int(pick() * 4096), A=a.title().replace("_", ""), B="Base"
            )
        else:
            count = 6 + int(pick() * 10)
            words = [WORDS[int(pick() * len(WORDS))] for _ in range(count)]
            line = " ".join(words).capitalize() + "."
        out.append(line)
        size += len(line) + 1
    return "\n".join(out)[:n_chars]


def words(key: str, tokens: int) -> str:
    """The user's words: prose of about `tokens` tokens."""
    return text(key, chars(tokens), code_share=0.1)
