"""Warm sets as the daemon holds them: the limits a pushed set must keep, the errors an
apply answers with (nothing is changed on any of them), each prompt's and set's state and
status, the content hashes that tell a changed prompt from an unchanged one, and the
`--warm-prompts` file reader."""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from dataclasses import dataclass, field

from warmfleet_common.chunking import BlockKey
from warmfleet_common.contract import (
    PromptState,
    WarmPrompt,
    WarmPromptStatus,
    WarmSetSpec,
    WarmSetStatus,
)
from warmfleet_common.prompts import RenderedPrompt

SetKey = tuple[str, str]  # (namespace, name)
# Content hashes are keyed per process: they tell "changed or not" to whoever may read
# them, but cannot confirm a guessed system prompt.
_HASH_KEY = secrets.token_bytes(16)
Rendered = tuple[RenderedPrompt, list[BlockKey], str]  # prefix, its block keys, content hash


@dataclass(frozen=True)
class Limits:
    max_sets: int = 64
    max_prompts_per_set: int = 64
    max_message_chars: int = 200_000
    max_pinned_fraction: float = 0.8  # of the cache budget; the rest is for traffic


class WarmSetError(Exception):
    """A set that cannot be applied; nothing was changed. `param`: the field at fault."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class WarmSetInvalid(WarmSetError):
    """The set cannot be warmed as written (a bad prompt, too many sets or prompts)."""


class WarmSetTooLarge(WarmSetError):
    """The set is larger than a limit (message size, pinned cache, the state file)."""


class WarmSetStale(WarmSetError):
    """An older generation than the one applied."""


class StateNotSaved(WarmSetError):
    """The state directory could not be written: the change was not made."""


@dataclass(eq=False)
class PromptEntry:
    spec: WarmPrompt
    rendered: RenderedPrompt
    keys: list[BlockKey]
    content_hash: str
    state: PromptState = PromptState.PENDING
    computed_tokens: int | None = None
    duration_s: float | None = None
    error: str | None = None
    warmed_at: float | None = None
    pinned: bool = False
    epoch: int = 0  # the cache epoch its warm-up started in (a clear bumps it)
    tenant: str | None = None  # warm for this tenant's requests only (None: every tenant's)

    @property
    def id(self) -> str:
        return entry_id(self.spec.name, self.tenant)

    def status(self) -> WarmPromptStatus:
        return WarmPromptStatus(
            name=self.spec.name,
            state=self.state,
            content_hash=self.content_hash,
            tokens=len(self.rendered.tokens),
            computed_tokens=self.computed_tokens,
            duration_s=self.duration_s,
            error=self.error,
            warmed_at=self.warmed_at,
            blocks=[key.hex() for key in self.keys],
            tenant=self.tenant,
        )


@dataclass(eq=False)
class SetEntry:
    namespace: str
    name: str
    spec: WarmSetSpec
    content_hash: str
    prompts: dict[str, PromptEntry]
    updated_at: float = field(default_factory=time.time)

    def status(self) -> WarmSetStatus:
        prompts = [p.status() for p in self.prompts.values()]
        return WarmSetStatus(
            namespace=self.namespace,
            name=self.name,
            generation=self.spec.generation,
            uid=self.spec.uid,
            source_hash=self.spec.source_hash,
            content_hash=self.content_hash,
            concurrency=self.spec.concurrency,
            pin=self.spec.pin,
            tenants=self.spec.tenants,
            prompts=prompts,
            warm=sum(p.state is PromptState.WARM for p in prompts),
            total=len(prompts),
            updated_at=self.updated_at,
        )


@dataclass
class WarmRound:
    """One burst of warm-ups, reported in one line when it drains."""

    started: float = field(default_factory=time.perf_counter)
    completed: int = 0
    skipped: int = 0  # already entirely cached: nothing to compute
    failed: int = 0
    tokens: int = 0


def scopes(spec: WarmSetSpec) -> list[str | None]:
    """The tenants a set's prompts are warmed for (None: once, for every tenant)."""
    return list(spec.tenants) if spec.tenants else [None]


def entry_id(prompt: str, tenant: str | None) -> str:
    """A prompt's entry in its set: one per tenant it is warm for (or one, shared)."""
    return prompt if tenant is None else f"{prompt}@{tenant}"


def content_of(result: Rendered | str) -> str:
    return result if isinstance(result, str) else result[2]


def hash_of(value: object) -> str:
    data = json.dumps(value, sort_keys=True, default=str).encode()
    return hashlib.blake2b(data, digest_size=12, key=_HASH_KEY).hexdigest()


def read_warm_prompts_file(path: str, *, concurrency: int = 2) -> WarmSetSpec:
    """`--warm-prompts FILE`: vllm-mlx's format (a JSON list of message lists) or
    warmfleet's (a list of `{name, messages, tools?}`, `{name, anthropic: {...}}` or
    `{name, responses: {...}}`, as `warmfleet warm-prompts capture` writes), in JSON or
    YAML."""
    import yaml
    from pydantic import ValidationError

    try:
        with open(path) as f:
            document = yaml.safe_load(f)
    except (OSError, yaml.YAMLError, RecursionError) as exc:
        raise ValueError(f"cannot read warm prompts file {path}: {exc}") from exc
    if isinstance(document, dict) and "prompts" in document:
        document = document["prompts"]
    if not isinstance(document, list) or not document:
        raise ValueError(f"{path}: expected a non-empty list of prompts")
    prompts = [
        {"name": f"prompt-{i + 1}", "messages": item} if isinstance(item, list) else item
        for i, item in enumerate(document)
    ]
    try:
        return WarmSetSpec.model_validate({"prompts": prompts, "concurrency": concurrency})
    except ValidationError as exc:
        raise ValueError(f"{path}: invalid warm prompts:\n{exc}") from exc
