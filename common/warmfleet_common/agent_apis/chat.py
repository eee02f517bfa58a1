"""What each agent API's request becomes before the chat template sees it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

# Seconds a `cache_control` breakpoint keeps its prefix pinned (Anthropic's two TTLs).
TTL_SECONDS = {"5m": 300, "1h": 3600}
# The breakpoint index that stands for "the end of the tool list".
TOOLS = -1


@dataclass(frozen=True)
class Breakpoint:
    """A `cache_control` marker: the prefix up to the end of message `message` (TOOLS:
    the tool list) is to be kept for `ttl` seconds."""

    message: int
    ttl: Literal["5m", "1h"] = "5m"


@dataclass(frozen=True)
class ChatOptions:
    """What the request asks of the output, in the chat API's terms, so the one
    constraint path (forced tool calls, JSON schemas) serves every API."""

    tool_choice: str | dict[str, Any] | None = None  # none | auto | required | named
    parallel_tool_calls: bool | None = None
    json_schema: dict[str, Any] | None = None  # the output must follow it
    json_object: bool = False
    thinking: bool | None = None  # the template's thinking switch; None: its default
    thinking_shown: bool = True  # False: thinking blocks come back empty (display: omitted)


@dataclass(frozen=True)
class ChatPrompt:
    """Chat-template messages and OpenAI function tools, as `PromptBuilder.chat` takes
    them, plus the cache breakpoints and the tool names as the client knows them."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    breakpoints: tuple[Breakpoint, ...] = ()
    # Name the model calls -> (namespace, name) as the client declared it (Responses'
    # namespace tools are flattened to "namespace.name").
    tool_names: dict[str, tuple[str | None, str]] = field(default_factory=dict)

    def template_kwargs(self, options: ChatOptions) -> dict[str, Any]:
        return {} if options.thinking is None else {"enable_thinking": options.thinking}


def function_tool(name: str, description: str | None, parameters: Any) -> dict[str, Any]:
    """An OpenAI function tool (what chat templates and the tool parsers take)."""
    function: dict[str, Any] = {"name": name}
    if description:
        function["description"] = description
    function["parameters"] = parameters if parameters else {"type": "object", "properties": {}}
    return {"type": "function", "function": function}


def text_only(kind: object) -> ValueError:
    return ValueError(
        f"content blocks of type {kind!r} are not supported: this model takes text only "
        "(no images, documents or files)"
    )
