"""A request's cache block keys, computed exactly as a daemon's engine computes them.

With a daemon's `CacheLayout` the router renders and tokenizes the request with the
daemon's own `PromptBuilder` and plans chunks with its chunk planner, so a key here is
the key of the block the daemon stores. Backends that serve no layout (any other
OpenAI server) get message-level keys instead: one chained block per message, sized in
characters / 4; only the router's own routing history knows those.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import ValidationError

from warmfleet_common.cache_layout import CacheLayout, LayoutTokenizer
from warmfleet_common.chunking import BlockKey, chain_key, plan_chunks, root_key
from warmfleet_common.contract import ChatMessage, ToolDefinition
from warmfleet_common.prompts import PromptBuilder, PromptError, RenderedPrompt

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


class Keyer(Protocol):
    fingerprint: str

    def chat(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None
    ) -> RequestBlocks: ...

    def completion(self, prompt: str | Sequence[int]) -> RequestBlocks: ...


class LayoutKeyer:
    """Keys of one daemon layout (tokenizer, template, chunk size, root)."""

    def __init__(self, layout: CacheLayout) -> None:
        self.fingerprint = layout.fingerprint
        self._prompts = PromptBuilder(LayoutTokenizer(layout))
        self._root = bytes.fromhex(layout.root)
        self._block_size = layout.block_size

    def chat(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None
    ) -> RequestBlocks:
        return self._blocks(self._prompts.chat(messages, tools))

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
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None
    ) -> RequestBlocks:
        keys: list[BlockKey] = []
        ends: list[int] = []
        parent, end = self._root, 0
        pieces = [json.dumps(list(tools or []), sort_keys=True)] + [
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


def request_blocks(keyer: Keyer, route: str, body: Mapping[str, Any]) -> RequestBlocks:
    """The blocks of a chat or completion body; EMPTY when the body cannot be rendered
    (the daemon will answer it with its own 400)."""
    try:
        if route == "chat":
            messages = [
                ChatMessage.model_validate(m).as_template_message() for m in body["messages"]
            ]
            raw_tools = body.get("tools") or None
            tools = (
                [ToolDefinition.model_validate(t).model_dump(exclude_none=True) for t in raw_tools]
                if raw_tools
                else None
            )
            return keyer.chat(messages, tools)
        prompt = single_prompt(body.get("prompt"))
        return keyer.completion(prompt) if prompt is not None else EMPTY
    except (KeyError, TypeError, ValueError, ValidationError, PromptError):
        return EMPTY


def single_prompt(prompt: Any) -> str | list[int] | None:
    """`prompt` as the daemon reads it: a string, token ids, or a list of one of those."""
    if isinstance(prompt, str):
        return prompt or None
    if isinstance(prompt, list) and prompt:
        if all(isinstance(t, int) for t in prompt):
            return [int(t) for t in prompt]
        if len(prompt) == 1:
            return single_prompt(prompt[0])
    return None
