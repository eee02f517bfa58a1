"""Anthropic's Messages API (what Claude Code sends): the request shapes and their
translation to chat messages.

Every field Claude Code 2.1 sends is declared: honoured, or accepted with no effect on
this server (said in its description and in the README); any other field is refused
with a 400 naming it (`extra="forbid"`), as Anthropic's API does.

Rendering: `system` (a string or text blocks) becomes the first system message; text
blocks of one message are joined by a blank line; `tool_use` blocks become the
assistant message's `tool_calls`; each `tool_result` becomes a `tool` message (an
error result says so first); `thinking` blocks passed back become the assistant
message's `reasoning_content` (what thinking templates render); `redacted_thinking`
blocks are opaque and dropped; `system`-role messages inside `messages` stay where
they are. Claude Code's `x-anthropic-billing-header:` system block is left out: it is
attribution for Anthropic's billing, not instructions, and its `cc_version` carries a
fingerprint of the session's first user message, so leaving it in would make every
session's prompt differ from its first token (no warm prefix could match it). Tools
with `defer_loading: true` are left out too, as Anthropic's API does until a tool search
loads them (this server runs no tool search).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from warmfleet_common.agent_apis.chat import (
    TOOLS,
    Breakpoint,
    ChatOptions,
    ChatPrompt,
    function_tool,
    text_only,
)

Ttl = Literal["5m", "1h"]
_TEXT_ONLY_BLOCKS = {"image", "document", "search_result", "container_upload"}
BLOCK_SEPARATOR = "\n\n"
MAX_STOP_SEQUENCES = 16
BILLING_HEADER = "x-anthropic-billing-header:"
MAX_PREFIX_MESSAGES = 64  # a warm prompt's leading messages


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CacheControl(_Strict):
    """`cache_control`: the prefix up to here is kept (pinned) for `ttl`."""

    type: Literal["ephemeral"]
    ttl: Literal["5m", "1h"] = "5m"


class TextBlock(_Strict):
    type: Literal["text"]
    text: str
    cache_control: CacheControl | None = None
    citations: list[dict[str, Any]] | None = Field(
        None, description="passed back from a response: no effect (this server cites nothing)"
    )


class ToolUseBlock(_Strict):
    type: Literal["tool_use"]
    id: str = Field(min_length=1, max_length=256)
    name: str = Field(min_length=1, max_length=256)
    input: dict[str, Any]
    cache_control: CacheControl | None = None


class ToolResultBlock(_Strict):
    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1, max_length=256)
    content: str | list[TextBlock] | None = None
    is_error: bool = False
    cache_control: CacheControl | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _text_only(cls, value: Any) -> Any:
        for block in value if isinstance(value, list) else []:
            kind = block.get("type") if isinstance(block, dict) else None
            if kind != "text":
                raise text_only(kind)
        return value

    def text(self) -> str:
        content = self.content or ""
        text = (
            content if isinstance(content, str) else BLOCK_SEPARATOR.join(b.text for b in content)
        )
        return f"Error: {text}" if self.is_error else text


class ThinkingBlock(_Strict):
    type: Literal["thinking"]
    thinking: str
    signature: str = Field("", description="opaque; not checked")
    cache_control: CacheControl | None = None


class RedactedThinkingBlock(_Strict):
    type: Literal["redacted_thinking"]
    data: str
    cache_control: CacheControl | None = None


ContentBlock = Annotated[
    TextBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock,
    Field(discriminator="type"),
]
_KNOWN_BLOCKS = {"text", "tool_use", "tool_result", "thinking", "redacted_thinking"}


class TurnOutputConfig(_Strict):
    """`output_config` on a message (Claude Code's per-turn control beta)."""

    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = Field(
        None, description="no effect: the served model has no effort control"
    )


class Message(_Strict):
    role: Literal["user", "assistant", "system"]
    content: str | list[ContentBlock]
    output_config: TurnOutputConfig | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _supported_blocks(cls, value: Any) -> Any:
        for block in value if isinstance(value, list) else []:
            kind = block.get("type") if isinstance(block, dict) else None
            if not isinstance(kind, str):
                continue  # the block's own validation says what is wrong
            if kind in _TEXT_ONLY_BLOCKS:
                raise text_only(kind)
            if kind not in _KNOWN_BLOCKS:
                raise ValueError(f"content blocks of type {kind!r} are not supported here")
        return value

    @model_validator(mode="after")
    def _blocks_fit_the_role(self) -> Message:
        for block in self.blocks():
            if self.role == "assistant" and isinstance(block, ToolResultBlock):
                raise ValueError("tool_result blocks belong in user messages")
            if self.role == "system" and not isinstance(block, TextBlock):
                raise ValueError("system messages take text blocks only")
            if self.role == "user" and not isinstance(block, TextBlock | ToolResultBlock):
                raise ValueError(f"{block.type} blocks belong in assistant messages")
        return self

    def blocks(self) -> list[Any]:
        if isinstance(self.content, str):
            return [TextBlock(type="text", text=self.content)]
        return list(self.content)


class Tool(_Strict):
    """A client tool. Anthropic's server tools (web search, code execution, ...) have
    a versioned `type` and are refused: this server runs no tools."""

    name: str = Field(min_length=1, max_length=128)
    description: str | None = None
    input_schema: dict[str, Any]
    type: Literal["custom"] | None = None
    cache_control: CacheControl | None = None
    strict: bool | None = Field(
        None, description="no effect: a call's input follows the schema only when forced"
    )
    eager_input_streaming: bool | None = Field(
        None, description="no effect: a call's input is streamed whole, once parsed"
    )
    defer_loading: bool | None = Field(
        None, description="true: left out of the prompt (this server runs no tool search)"
    )

    @model_validator(mode="before")
    @classmethod
    def _client_tools_only(cls, data: Any) -> Any:
        kind = data.get("type") if isinstance(data, dict) else None
        if kind not in (None, "custom"):
            raise ValueError(
                f"tools of type {kind!r} (Anthropic server tools) are not supported: "
                "this server runs no tools; declare client tools with input_schema"
            )
        return data


class ToolChoiceAuto(_Strict):
    type: Literal["auto"]
    disable_parallel_tool_use: bool = False


class ToolChoiceAny(_Strict):
    type: Literal["any"]
    disable_parallel_tool_use: bool = False


class ToolChoiceTool(_Strict):
    type: Literal["tool"]
    name: str = Field(min_length=1, max_length=128)
    disable_parallel_tool_use: bool = False


class ToolChoiceNone(_Strict):
    type: Literal["none"]


ToolChoice = Annotated[
    ToolChoiceAuto | ToolChoiceAny | ToolChoiceTool | ToolChoiceNone, Field(discriminator="type")
]


# "updates" (a beta; Claude Code's stream-json mode asks for it) shows thinking as it is
# written, as "summarized" does here: the model's own thinking is never summarized.
Display = Literal["summarized", "omitted", "updates"]


class ThinkingEnabled(_Strict):
    type: Literal["enabled"]
    budget_tokens: int = Field(ge=1, description="not enforced: thinking counts in max_tokens")
    display: Display | None = None


class ThinkingAdaptive(_Strict):
    type: Literal["adaptive"]
    display: Display | None = None


class ThinkingDisabled(_Strict):
    type: Literal["disabled"]


Thinking = Annotated[
    ThinkingEnabled | ThinkingAdaptive | ThinkingDisabled, Field(discriminator="type")
]


class JsonOutputFormat(_Strict):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(_Strict):
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = Field(
        None, description="no effect: the served model has no effort control"
    )
    format: JsonOutputFormat | None = Field(
        None, description="the output follows this JSON schema (enforced while decoding)"
    )


class Metadata(_Strict):
    user_id: str | None = Field(
        None, max_length=4096, description="recorded in the daemon's logs for the request"
    )


class ClearThinkingKeep(_Strict):
    type: Literal["thinking_turns"]
    value: int = Field(ge=0)


class ClearThinking(_Strict):
    """Drop the thinking of all but the last `keep` assistant turns before rendering."""

    type: Literal["clear_thinking_20251015"]
    keep: Literal["all"] | ClearThinkingKeep = "all"


class ContextManagement(_Strict):
    edits: list[ClearThinking] = Field(default_factory=list, max_length=8)

    @field_validator("edits", mode="before")
    @classmethod
    def _known_edits(cls, value: Any) -> Any:
        for edit in value if isinstance(value, list) else []:
            kind = edit.get("type") if isinstance(edit, dict) else None
            if kind != "clear_thinking_20251015":
                raise ValueError(
                    f"context edits of type {kind!r} are not supported (only "
                    "clear_thinking_20251015)"
                )
        return value


def thinking_switch(thinking: Thinking | None) -> bool | None:
    """The template's thinking switch a `thinking` field sets (None: the default)."""
    return None if thinking is None else not isinstance(thinking, ThinkingDisabled)


class MessagesPrefix(_Strict):
    """The part of a request that becomes the prompt, up to where requests differ: how
    a warm prompt is written in this API's shape. `messages` are the leading ones every
    request starts with (often none: the first user message carries the user's words);
    `thinking`, because it switches the chat template. Rendered by `to_chat`, exactly
    as a request is."""

    system: str | list[TextBlock] | None = None
    messages: list[Message] | None = Field(None, max_length=MAX_PREFIX_MESSAGES)
    tools: list[Tool] | None = Field(None, max_length=512)
    thinking: Thinking | None = None

    @model_validator(mode="after")
    def _something_to_render(self) -> MessagesPrefix:
        if not (self.system or self.messages or self.tools):
            raise ValueError("give at least one of system, messages and tools")
        return self

    def options(self) -> ChatOptions:
        return ChatOptions(thinking=thinking_switch(self.thinking))

    def chat(self) -> ChatPrompt:
        return to_chat(self)


class MessagesPrompt(MessagesPrefix):
    """The part of a request that becomes the prompt."""

    messages: list[Message] = Field(min_length=1, max_length=100_000)


class _PromptOptions(MessagesPrompt):
    model: str = Field(min_length=1, max_length=256)
    tool_choice: ToolChoice | None = None
    output_config: OutputConfig | None = None
    context_management: ContextManagement | None = None
    cache_control: CacheControl | None = Field(
        None, description="automatic caching: a breakpoint on the last block"
    )

    @model_validator(mode="after")
    def _tool_choice_needs_tools(self) -> _PromptOptions:
        choice = self.tool_choice
        if isinstance(choice, ToolChoiceAny | ToolChoiceTool) and not self.tools:
            raise ValueError("tool_choice: needs tools")
        if isinstance(choice, ToolChoiceTool) and choice.name not in {
            t.name for t in self.tools or []
        }:
            raise ValueError(f"tool_choice: no tool named {choice.name!r} in tools")
        return self

    def options(self) -> ChatOptions:
        choice = self.tool_choice
        parallel = None
        if isinstance(choice, ToolChoiceAuto | ToolChoiceAny | ToolChoiceTool):
            parallel = False if choice.disable_parallel_tool_use else None
        openai_choice: str | dict[str, Any] | None
        if choice is None:
            openai_choice = "auto" if self.tools else None
        elif isinstance(choice, ToolChoiceAuto):
            openai_choice = "auto"
        elif isinstance(choice, ToolChoiceAny):
            openai_choice = "required"
        elif isinstance(choice, ToolChoiceTool):
            openai_choice = {"type": "function", "function": {"name": choice.name}}
        else:
            openai_choice = "none"
        thinking = self.thinking
        schema = self.output_config.format if self.output_config else None
        return ChatOptions(
            tool_choice=openai_choice,
            parallel_tool_calls=parallel,
            json_schema=schema.schema_ if schema is not None else None,
            thinking=thinking_switch(thinking),
            thinking_shown=getattr(thinking, "display", None) != "omitted",
        )

    def chat(self) -> ChatPrompt:
        return to_chat(self, self.context_management, self.cache_control)


class CountTokensRequest(_PromptOptions):
    """Body of `POST /v1/messages/count_tokens`."""


class MessagesRequest(_PromptOptions):
    """Body of `POST /v1/messages`."""

    max_tokens: int = Field(
        ge=0,
        description="beyond what the context leaves, the response runs to the context's "
        "end (stop_reason max_tokens); 0 only fills the prompt cache",
    )
    stream: bool = False
    stop_sequences: list[str] | None = Field(None, max_length=MAX_STOP_SEQUENCES)
    temperature: float | None = Field(None, ge=0.0, le=1.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0)
    metadata: Metadata | None = None
    cache_salt: str | None = Field(
        None,
        min_length=1,
        max_length=256,
        description="vLLM's, as a warmfleet extension: this request's cache blocks are "
        "keyed apart from every request without the same salt (isolation within a tenant)",
    )

    @field_validator("stop_sequences")
    @classmethod
    def _bounded_stops(cls, value: list[str] | None) -> list[str] | None:
        if any(not s or len(s) > 256 for s in value or []):
            raise ValueError("stop sequences must have 1 to 256 characters")
        return value


# -- translation ---------------------------------------------------------------------


def to_chat(
    prompt: MessagesPrefix,
    context: ContextManagement | None = None,
    automatic: CacheControl | None = None,
) -> ChatPrompt:
    """The chat messages, tools and cache breakpoints of an Anthropic prompt."""
    messages: list[dict[str, Any]] = []
    breakpoints: list[Breakpoint] = []
    blocks = system_blocks(prompt.system)
    if blocks:
        messages.append({"role": "system", "content": BLOCK_SEPARATOR.join(b.text for b in blocks)})
        breakpoints += [Breakpoint(0, b.cache_control.ttl) for b in blocks if b.cache_control]
    keep_thinking = _thinking_turns_kept(prompt, context)
    assistant_turn = 0
    leading = prompt.messages or []
    assistants = sum(m.role == "assistant" for m in leading)
    for message in leading:
        if message.role == "assistant":
            assistant_turn += 1
            keep = keep_thinking is None or assistants - assistant_turn < keep_thinking
            before = len(messages)
            messages.append(_assistant(message, keep))
            marks = [b for b in message.blocks() if getattr(b, "cache_control", None)]
            breakpoints += [Breakpoint(before, b.cache_control.ttl) for b in marks]
        else:
            for chat_message, marks in _user_or_system(message):
                messages.append(chat_message)
                breakpoints += [Breakpoint(len(messages) - 1, ttl) for ttl in marks]
    tools = None
    listed = [t for t in prompt.tools or [] if not t.defer_loading]
    if listed:
        tools = [function_tool(t.name, t.description, t.input_schema) for t in listed]
        breakpoints += [Breakpoint(TOOLS, t.cache_control.ttl) for t in listed if t.cache_control]
    if automatic is not None and messages:
        breakpoints.append(Breakpoint(len(messages) - 1, automatic.ttl))
    return ChatPrompt(messages, tools, tuple(breakpoints))


def system_blocks(system: str | list[TextBlock] | None) -> list[TextBlock]:
    """The system prompt's blocks as rendered: Claude Code's billing header left out."""
    if not system:
        return []
    if isinstance(system, str):
        return [TextBlock(type="text", text=system)]
    return [b for b in system if not is_billing_header(b.text)]


def is_billing_header(text: str) -> bool:
    """Claude Code's one-line attribution block (`x-anthropic-billing-header: cc_version=
    2.1.332.0b8; cc_entrypoint=sdk-cli;`), whose fingerprint changes every session."""
    return text.startswith(BILLING_HEADER) and "\n" not in text.strip()


def _thinking_turns_kept(prompt: MessagesPrefix, context: ContextManagement | None) -> int | None:
    kept = None
    for edit in context.edits if context else []:
        if isinstance(edit.keep, ClearThinkingKeep):
            kept = edit.keep.value if kept is None else min(kept, edit.keep.value)
    return kept


def _assistant(message: Message, keep_thinking: bool) -> dict[str, Any]:
    texts, thinking, calls = [], [], []
    for block in message.blocks():
        if isinstance(block, TextBlock):
            texts.append(block.text)
        elif isinstance(block, ThinkingBlock):
            thinking.append(block.thinking)
        elif isinstance(block, ToolUseBlock):
            calls.append(
                {
                    "id": block.id,
                    "type": "function",
                    "function": {
                        "name": block.name,
                        "arguments": json.dumps(block.input, ensure_ascii=False),
                    },
                }
            )
    out: dict[str, Any] = {"role": "assistant", "content": BLOCK_SEPARATOR.join(texts)}
    if thinking and keep_thinking:
        out["reasoning_content"] = BLOCK_SEPARATOR.join(thinking)
    if calls:
        out["tool_calls"] = calls
    return out


def _user_or_system(message: Message) -> list[tuple[dict[str, Any], list[Ttl]]]:
    """A user (or system) message as chat messages, in order: a `tool` message per
    tool result, the text between them as user messages; with each one's breakpoints."""
    out: list[tuple[dict[str, Any], list[Ttl]]] = []
    texts: list[str] = []
    marks: list[Ttl] = []

    def flush() -> None:
        if texts:
            out.append(
                ({"role": message.role, "content": BLOCK_SEPARATOR.join(texts)}, list(marks))
            )
            texts.clear()
            marks.clear()

    for block in message.blocks():
        if isinstance(block, TextBlock):
            texts.append(block.text)
            if block.cache_control:
                marks.append(block.cache_control.ttl)
        elif isinstance(block, ToolResultBlock):
            flush()
            result = {"role": "tool", "tool_call_id": block.tool_use_id, "content": block.text()}
            out.append((result, [block.cache_control.ttl] if block.cache_control else []))
    flush()
    if not out:  # an empty content list still is a turn
        out.append(({"role": message.role, "content": ""}, []))
    return out
