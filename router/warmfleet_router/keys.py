"""A prompt's cache block keys, computed exactly as a daemon's engine computes them.

A route turns a request body into a `Prompt` (a chat: OpenAI-shaped messages and tools,
as the daemon hands them to its chat template; or a completion's text or token ids);
see `routes`. With a daemon's `CacheLayout` the router renders and tokenizes it with
the daemon's own `PromptBuilder` and plans chunks with its chunk planner, so a key here
is the key of the block the daemon stores. Backends that serve no layout (any other
OpenAI server) get message-level keys instead: one chained block per message, sized in
characters / 4; only the router's own routing history knows those.

A salted request (a tenant's, or one with its own `cache_salt`: `tenancy.cache_salt`)
is keyed in the salt's namespace, as the daemons key it; its leading blocks' unsalted
keys are kept too (up to `shared_tokens`), and `RequestBlocks.on` picks, for one
backend, the run of them that backend shares with every tenant (its pinned fleet-wide
warm prompts), as its engine does (`chunking`).
"""

from __future__ import annotations

import hashlib
import json
import struct
import sys
from array import array
from collections.abc import Container, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from warmfleet_common.cache_layout import CacheLayout
from warmfleet_common.chunking import (
    BlockKey,
    block_bounds,
    chain_key,
    chain_keys,
    plan_chunks,
    root_key,
    salted_root,
    shared_run,
    unsalted_keys,
)
from warmfleet_common.prompts import PromptBuilder, PromptError, RenderedPrompt
from warmfleet_router.tokenizing import FastLayoutTokenizer

MESSAGE_KEYS = "messages"  # the fingerprint of message-level keys


@dataclass(frozen=True)
class RequestBlocks:
    """A request's blocks in prefill order: key and end (in tokens) of each."""

    keys: tuple[BlockKey, ...]
    ends: tuple[int, ...]
    tokens: int  # prompt tokens
    # A salted request's leading blocks' unsalted keys (see the module's docstring).
    unsalted: tuple[BlockKey, ...] = ()

    @property
    def last_key(self) -> BlockKey | None:
        return self.keys[-1] if self.keys else None

    def on(self, shared: Container[BlockKey]) -> RequestBlocks:
        """The keys a backend sharing `shared` (its fleet-wide warm blocks) uses."""
        run = shared_run(self.unsalted, shared)
        if not run:
            return replace(self, unsalted=()) if self.unsalted else self
        return RequestBlocks((*run, *self.keys[len(run) :]), self.ends, self.tokens)


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


@dataclass(frozen=True)
class Salt:
    """The namespace a request's blocks are keyed in (`tenancy.cache_salt`), and how far
    into the prompt its unsalted keys are kept (the longest fleet-wide warm prompt)."""

    salt: bytes = b""
    shared_tokens: int = 0


UNSALTED = Salt()


class Keyer(Protocol):
    fingerprint: str

    def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None,
        template_kwargs: Mapping[str, Any] | None = None,
        salt: Salt = UNSALTED,
    ) -> RequestBlocks: ...

    def completion(self, prompt: str | Sequence[int], salt: Salt = UNSALTED) -> RequestBlocks: ...


def prompt_blocks(keyer: Keyer, prompt: Prompt, salt: Salt = UNSALTED) -> RequestBlocks:
    """The blocks of a prompt; EMPTY when it cannot be rendered (the daemon will answer
    the request with its own 400)."""
    try:
        if isinstance(prompt, ChatPrompt):
            return keyer.chat(prompt.messages, prompt.tools, prompt.template_kwargs, salt)
        return keyer.completion(prompt.prompt, salt)
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
        salt: Salt = UNSALTED,
    ) -> RequestBlocks:
        rendered = self._prompts.chat(messages, tools, template_kwargs=template_kwargs)
        return self._blocks(rendered, salt)

    def completion(self, prompt: str | Sequence[int], salt: Salt = UNSALTED) -> RequestBlocks:
        return self._blocks(self._prompts.completion(prompt), salt)

    def _blocks(self, prompt: RenderedPrompt, salt: Salt) -> RequestBlocks:
        tokens, cuts, size = prompt.tokens, prompt.cuts, self._block_size
        chunks = plan_chunks(tokens, block_size=size, cuts=cuts, root=self._root, salt=salt.salt)
        unsalted = (
            unsalted_keys(
                tokens, block_size=size, cuts=cuts, root=self._root, up_to=salt.shared_tokens
            )
            if salt.salt
            else []
        )
        return RequestBlocks(
            tuple(c.key for c in chunks),
            tuple(c.end for c in chunks),
            len(prompt.tokens),
            tuple(unsalted),
        )

    @property
    def prompts(self) -> PromptBuilder:
        return self._prompts

    def resumed(
        self,
        tokens: array[int],
        cuts: Sequence[int],
        salt: Salt,
        prior: RequestBlocks | None,
        same: int,
    ) -> RequestBlocks:
        """`_blocks` of a prompt whose first `same` tokens are those of the prompt keyed
        as `prior` (with the same salt): the prior's keys up to its last block that ends
        there on the same boundaries, the rest chained on from it."""
        bounds = block_bounds(len(tokens), self._block_size, cuts)
        reused = 0
        if prior is not None:
            limit = min(len(bounds), len(prior.ends))
            while reused < limit and bounds[reused] == prior.ends[reused] <= same:
                reused += 1
        start = bounds[reused - 1] if reused else 0
        parent = prior.keys[reused - 1] if prior is not None and reused else None
        parent = parent or salted_root(self._root, salt.salt)
        keys = chain_keys(_le32(tokens[start:]), bounds[reused:], parent, start)
        head = prior.keys[:reused] if prior is not None else ()
        unsalted: tuple[BlockKey, ...] = ()
        if salt.salt:
            shared = [end for end in bounds if end <= salt.shared_tokens]
            if (
                prior is not None
                and len(prior.unsalted) == len(shared)
                and list(prior.ends[: len(shared)]) == shared
                and (not shared or shared[-1] <= same)
            ):
                unsalted = prior.unsalted
            else:
                packed = _le32(tokens[: shared[-1]]) if shared else b""
                unsalted = tuple(chain_keys(packed, shared, self._root))
        return RequestBlocks((*head, *keys), tuple(bounds), len(tokens), unsalted)


def _le32(tokens: array[int]) -> bytes:
    """Token ids as block keys hash them (`chunking`: little-endian, 4 bytes each)."""
    if tokens.itemsize == 4 and sys.byteorder == "little":
        return tokens.tobytes()
    return struct.pack(f"<{len(tokens)}I", *tokens)


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
        salt: Salt = UNSALTED,
    ) -> RequestBlocks:
        keys: list[BlockKey] = []
        ends: list[int] = []
        parent, end = salted_root(self._root, salt.salt), 0
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

    def completion(self, prompt: str | Sequence[int], salt: Salt = UNSALTED) -> RequestBlocks:
        text = prompt if isinstance(prompt, str) else json.dumps(list(prompt))
        key = _text_key(salted_root(self._root, salt.salt), text)
        return RequestBlocks((key,), (max(1, len(text) // 4),), max(1, len(text) // 4))


def _text_key(parent: BlockKey, text: str) -> BlockKey:
    return chain_key(parent, list(hashlib.blake2b(text.encode(), digest_size=16).digest()))
