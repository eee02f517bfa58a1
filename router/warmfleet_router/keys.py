"""A prompt's cache block keys, computed exactly as a daemon's engine computes them.

A route turns a request body into a `Prompt` (a chat: OpenAI-shaped messages and tools,
as the daemon hands them to its chat template; or a completion's text or token ids);
see `routes`. With a daemon's `CacheLayout` the router renders and tokenizes it with
the daemon's own `PromptBuilder` and plans chunks with its chunk planner, so a key here
is the key of the block the daemon stores. Backends that serve no layout (any other
OpenAI server) get message-level keys instead: one chained block per message, sized in
characters / 4; only the router's own routing history knows those.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from warmfleet_common.cache_layout import CacheLayout
from warmfleet_common.chunking import BlockKey, chain_key, plan_chunks, root_key
from warmfleet_common.prompts import PromptBuilder, PromptError, RenderedPrompt
from warmfleet_router.tokenizing import FastLayoutTokenizer

MESSAGE_KEYS = "messages"  # the fingerprint of message-level keys


@dataclass(frozen=True)
class RequestBlocks:
    """A request's blocks in prefill order: key and end (in tokens) of each."""

    keys: tuple[BlockKey, ...]
    ends: tuple[int, ...]
    tokens: int  # prompt tokens

    @property
    def last_key(self) -> BlockKey | None:
        return self.keys[-1] if self.keys else None


EMPTY = RequestBlocks((), (), 0)


@dataclass(frozen=True)
class ChatPrompt:
    """Messages and tools as the daemon hands them to its chat template, with the extra
    template arguments the request sets (the thinking switch of an agent API request)."""

    messages: Sequence[Mapping[str, Any]]
    tools: Sequence[Mapping[str, Any]] | None = None
    template_kwargs: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TextPrompt:
    """A completion's prompt: text, or token ids."""

    prompt: str | Sequence[int]


Prompt = ChatPrompt | TextPrompt


class Keyer(Protocol):
    fingerprint: str

    def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> RequestBlocks: ...

    def completion(self, prompt: str | Sequence[int]) -> RequestBlocks: ...


def prompt_blocks(keyer: Keyer, prompt: Prompt) -> RequestBlocks:
    """The blocks of a prompt; EMPTY when it cannot be rendered (the daemon will answer
    the request with its own 400)."""
    try:
        if isinstance(prompt, ChatPrompt):
            return keyer.chat(prompt.messages, prompt.tools, prompt.template_kwargs)
        return keyer.completion(prompt.prompt)
    except (KeyError, TypeError, ValueError, PromptError):
        return EMPTY


class LayoutKeyer:
    """Keys of one daemon layout (tokenizer, template, chunk size, root)."""

    def __init__(self, layout: CacheLayout) -> None:
        self.fingerprint = layout.fingerprint
        tokenizer = FastLayoutTokenizer(layout)
        self.vocab_size = tokenizer.vocab_size  # as a daemon counts it: added tokens too
        self.max_token_bytes = tokenizer.max_token_bytes  # of its longest token
        self._prompts = PromptBuilder(tokenizer)
        self._root = bytes.fromhex(layout.root)
        self._block_size = layout.block_size

    def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> RequestBlocks:
        return self._blocks(self._prompts.chat(messages, tools, template_kwargs=template_kwargs))

    def completion(self, prompt: str | Sequence[int]) -> RequestBlocks:
        return self._blocks(self._prompts.completion(prompt))

    def _blocks(self, prompt: RenderedPrompt) -> RequestBlocks:
        chunks = plan_chunks(
            prompt.tokens, block_size=self._block_size, cuts=prompt.cuts, root=self._root
        )
        return RequestBlocks(
            tuple(c.key for c in chunks), tuple(c.end for c in chunks), len(prompt.tokens)
        )


class MessageKeyer:
    """One block per message (a prefix of the conversation), ~4 characters per token."""

    fingerprint = MESSAGE_KEYS

    def __init__(self) -> None:
        self._root = root_key("warmfleet-router-messages")

    def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> RequestBlocks:
        keys: list[BlockKey] = []
        ends: list[int] = []
        parent, end = self._root, 0
        head: Any = list(tools or [])
        if template_kwargs:  # the thinking switch renders another prompt
            head = [head, dict(template_kwargs)]
        pieces = [json.dumps(head, sort_keys=True)] + [
            json.dumps(dict(m), sort_keys=True, default=str) for m in messages
        ]
        for piece in pieces:
            parent = _text_key(parent, piece)
            end += max(1, len(piece) // 4)
            keys.append(parent)
            ends.append(end)
        return RequestBlocks(tuple(keys), tuple(ends), end)

    def completion(self, prompt: str | Sequence[int]) -> RequestBlocks:
        text = prompt if isinstance(prompt, str) else json.dumps(list(prompt))
        key = _text_key(self._root, text)
        return RequestBlocks((key,), (max(1, len(text) // 4),), max(1, len(text) // 4))


def _text_key(parent: BlockKey, text: str) -> BlockKey:
    return chain_key(parent, list(hashlib.blake2b(text.encode(), digest_size=16).digest()))
