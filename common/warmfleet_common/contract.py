"""The push contract between the operator and the daemons: pydantic models only.

The operator imports this module, so it must never import mlx (an import-linter
contract checks it). The chat message and tool shapes are OpenAI's, shared with the
daemon's chat API, and the agent APIs' prompt shapes are `warmfleet_common.agent_apis`',
shared with their routes, so a warm prompt renders exactly like a request.
"""

from __future__ import annotations

import re
from enum import Enum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from warmfleet_common.agent_apis.anthropic import MessagesPrefix
from warmfleet_common.agent_apis.chat import ChatOptions, ChatPrompt
from warmfleet_common.agent_apis.responses import ResponsesPrefix
from warmfleet_common.agent_apis.shapes import SHAPES, ApiName
from warmfleet_common.client_keys import TENANT_PATTERN
from warmfleet_common.grants import GRANT_PATTERN

Role = Literal["system", "developer", "user", "assistant", "tool"]

# Kubernetes object name rules, so namespaces and names map 1:1 to WarmPromptSets.
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"
PROMPT_NAME = r"^[a-zA-Z0-9]([-a-zA-Z0-9_.]{0,61}[a-zA-Z0-9])?$"
PEER_URL = r"https?://[^\s/?#]+(/[^\s?#]*)?"


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Role
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _text_parts_only(cls, data: Any) -> Any:
        """Say that images (audio, files) are not supported, rather than that the
        content "should be a valid string"."""
        content = data.get("content") if isinstance(data, dict) else None
        if isinstance(content, list):
            for part in content:
                kind = part.get("type") if isinstance(part, dict) else None
                if kind != "text":
                    raise ValueError(
                        f"content parts of type {kind!r} are not supported: this model "
                        "takes text only (no images, audio or files)"
                    )
        return data

    def as_template_message(self) -> dict[str, Any]:
        """The dict handed to the chat template (text parts joined)."""
        out: dict[str, Any] = {"role": self.role}
        if isinstance(self.content, list):
            out["content"] = "".join(p.text for p in self.content)
        else:
            out["content"] = self.content if self.content is not None else ""
        for key in ("name", "tool_calls", "tool_call_id"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        # vLLM's field for an assistant's reasoning passed back (what thinking templates read)
        reasoning = (self.model_extra or {}).get("reasoning_content")
        if self.role == "assistant" and isinstance(reasoning, str) and reasoning:
            out["reasoning_content"] = reasoning
        return out

    def text_length(self) -> int:
        if isinstance(self.content, list):
            return sum(len(p.text) for p in self.content)
        return len(self.content or "")


class FunctionDefinition(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str = Field(min_length=1, max_length=128)
    description: str | None = None
    parameters: dict[str, Any] | None = None


class ToolDefinition(BaseModel):
    type: Literal["function"]
    function: FunctionDefinition


class WarmPrompt(BaseModel):
    """One prompt to keep warm: the start every request of an agent shares, written in
    the shape of the API the agent speaks, and rendered exactly as that API's route
    renders a request:

    - chat completions: `messages` (at least one) and `tools`, OpenAI's chat shape;
    - `anthropic: {system, tools, messages, thinking}`: a Messages API request's prompt
      fields (Claude Code), `messages` being the leading ones (often none);
    - `responses: {instructions, input, tools, reasoning}`: a Responses API request's
      (Codex), `input` being the leading items.

    The agent shapes are nested under the API's name rather than set beside a `format`
    discriminator: inside, every field is spelled as in that API's request, so a
    captured or copied request body drops in unchanged; `messages` and `tools` mean
    different things in each API, and a CRD's structural schema gives a field one
    schema, so they cannot share a level; and in a WarmPromptSet the key says at a
    glance which route the prompt warms."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=PROMPT_NAME)
    messages: list[ChatMessage] | None = Field(None, min_length=1, max_length=256)
    tools: list[ToolDefinition] | None = Field(None, max_length=128)
    anthropic: MessagesPrefix | None = None
    responses: ResponsesPrefix | None = None

    @field_validator("messages")
    @classmethod
    def _known_fields_only(cls, messages: list[ChatMessage] | None) -> list[ChatMessage] | None:
        # Fields warm-up does not render would be kept and saved unbounded: refuse them.
        for i, message in enumerate(messages or []):
            if message.model_extra:
                raise ValueError(
                    f"message {i} has fields a warm prompt does not use: "
                    f"{', '.join(sorted(message.model_extra))}"
                )
        return messages

    @model_validator(mode="after")
    def _one_shape(self) -> WarmPrompt:
        fields = [s.prompt_field for s in SHAPES.values()]
        given = [k for k in fields if getattr(self, k) is not None]
        if len(given) != 1:
            shapes = [f"{s.prompt_field} ({s.title})" for s in SHAPES.values()]
            raise ValueError(
                f"give exactly one of {', '.join(shapes[:-1])} and {shapes[-1]}; "
                f"got {', '.join(given) or 'none'}"
            )
        if self.tools is not None and self.messages is None:
            raise ValueError(f"tools belong inside {given[0]} (in that API's tool shape)")
        return self

    @property
    def api(self) -> ApiName:
        """The shape it is written in (exactly one field holds it)."""
        return next(s.name for s in SHAPES.values() if getattr(self, s.prompt_field) is not None)

    def chat(self) -> tuple[ChatPrompt, ChatOptions]:
        """The chat messages and tools the template renders, and the template switches:
        what the route of this prompt's API makes of a request that starts with it."""
        shape = self.anthropic or self.responses
        if shape is not None:
            return shape.chat(), shape.options()
        return ChatPrompt(self.template_messages(), self.template_tools()), ChatOptions()

    def template_messages(self) -> list[dict[str, Any]]:
        return [m.as_template_message() for m in self.messages or []]

    def template_tools(self) -> list[dict[str, Any]] | None:
        return [t.model_dump(exclude_none=True) for t in self.tools] if self.tools else None


class PeerRef(BaseModel):
    """A warm peer named in a push, with a grant to read its blocks when the pusher
    holds its admin token (`warmfleet_common.grants`): without one the daemon asks the
    peer with its own admin token, which helps only when the two share it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str = Field(max_length=2048, description="the peer's base URL (http or https)")
    grant: str | None = Field(
        None,
        pattern=GRANT_PATTERN,
        description="`<expiry>.<hex>`: HMAC-SHA256 with the peer's admin token; read-only, "
        "for its fingerprint and blocks, until the expiry (Unix seconds)",
    )


class WarmSetSpec(BaseModel):
    """Body of `PUT /v1/warm-sets/{namespace}/{name}`."""

    model_config = ConfigDict(extra="forbid")

    generation: int = Field(0, ge=0, description="the WarmPromptSet's metadata.generation")
    uid: str | None = Field(
        None,
        max_length=128,
        description="the pusher's identity for the object (the WarmPromptSet's metadata.uid); "
        "generations are ordered only within one uid, a new uid replaces whatever is held",
    )
    prompts: list[WarmPrompt] = Field(default_factory=list, max_length=256)
    concurrency: int = Field(2, ge=1, le=16, description="warm-ups in flight at once")
    pin: bool = Field(True, description="keep the warmed blocks out of LRU eviction")
    source_hash: str | None = Field(
        None,
        max_length=128,
        description="the pusher's hash of what it resolved (e.g. ConfigMap contents); echoed "
        "in the status so it can tell whether a node has the latest",
    )
    peers: list[str | PeerRef] = Field(
        default_factory=list,
        max_length=8,
        description="daemons known to be warm for this set, each a base URL or "
        "`{url, grant}`: their blocks are copied (when their KV fingerprint matches) "
        "before anything is prefilled; not part of the content, so changing it re-warms "
        "nothing",
    )
    tenants: list[str] | None = Field(
        None,
        min_length=1,
        max_length=64,
        description="the tenants this set is warm for, each in its own cache namespace "
        "(their requests hit it, no other tenant's can); none: fleet-wide, shared by every "
        "tenant (agents' system prompts)",
    )

    @field_validator("tenants")
    @classmethod
    def _tenant_names(cls, tenants: list[str] | None) -> list[str] | None:
        bad = [t for t in tenants or [] if not re.fullmatch(TENANT_PATTERN, t)]
        if bad:
            raise ValueError(f"tenants must match {TENANT_PATTERN}; not: {', '.join(bad)}")
        if tenants is not None and len(set(tenants)) != len(tenants):
            raise ValueError("tenants must be unique")
        return tenants

    @field_validator("peers")
    @classmethod
    def _peer_urls(cls, peers: list[str | PeerRef]) -> list[str | PeerRef]:
        urls = [p if isinstance(p, str) else p.url for p in peers]
        bad = [u for u in urls if len(u) > 2048 or not re.fullmatch(PEER_URL, u)]
        if bad:
            raise ValueError(f"peers must be http(s) base URLs; not: {', '.join(bad)}")
        return [
            p.rstrip("/") if isinstance(p, str) else p.model_copy(update={"url": p.url.rstrip("/")})
            for p in peers
        ]

    def peer_refs(self) -> list[PeerRef]:
        """`peers`, each as a `PeerRef` (a bare URL: no grant)."""
        return [PeerRef(url=p) if isinstance(p, str) else p for p in self.peers]

    @field_validator("prompts")
    @classmethod
    def _unique_names(cls, prompts: list[WarmPrompt]) -> list[WarmPrompt]:
        names = [p.name for p in prompts]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"prompt names must be unique; repeated: {', '.join(duplicates)}")
        return prompts


class PromptState(str, Enum):
    PENDING = "pending"
    WARMING = "warming"
    WARM = "warm"
    FAILED = "failed"


class WarmPromptStatus(BaseModel):
    name: str
    state: PromptState
    content_hash: str  # of the rendered, tokenized prefix: what warm-up prefills
    tokens: int  # prefix length in tokens (the cached_tokens a matching request gets)
    computed_tokens: int | None = None  # prefilled by the last warm-up (0: was cached)
    duration_s: float | None = None
    error: str | None = None
    warmed_at: float | None = None  # unix time
    # Hex keys of the prefix's cache blocks, in order: what a router counts as held by
    # every daemon where the prompt is warm and pinned.
    blocks: list[str] = Field(default_factory=list)
    tenant: str | None = None  # the tenant it is warm for (None: every tenant, shared)


class WarmSetStatus(BaseModel):
    namespace: str
    name: str
    generation: int
    uid: str | None = None
    source_hash: str | None = None
    content_hash: str
    concurrency: int
    pin: bool
    tenants: list[str] | None = None  # None: fleet-wide (its blocks shared by every tenant)
    prompts: list[WarmPromptStatus]
    warm: int
    total: int
    updated_at: float


class WarmSetList(BaseModel):
    sets: list[WarmSetStatus]


class CacheClearResult(BaseModel):
    status: Literal["cleared"] = "cleared"
    rewarm_scheduled: bool
    entries_removed: int
