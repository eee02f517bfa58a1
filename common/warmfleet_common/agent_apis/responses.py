"""OpenAI's Responses API (what Codex sends), stateless: the request shapes and their
translation to chat messages.

Rendering: `instructions` and the leading `system`/`developer` messages become one
system message (templates want one, first); message parts (`input_text`,
`output_text`) are joined; `function_call` items become the assistant's `tool_calls`,
`function_call_output` items `tool` messages; `reasoning` items passed back become the
next assistant message's `reasoning_content`. Function tools and the functions of
`namespace` tools (named `namespace.name` for the model) go to the template; hosted
tools this server cannot run (`web_search`, `file_search`, ...) are left out of the
prompt and named in the response.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from warmfleet_common.agent_apis.chat import ChatOptions, ChatPrompt, function_tool, text_only

MAX_PREFIX_ITEMS = 64  # a warm prompt's leading input items
HOSTED_TOOLS = {
    "web_search",
    "web_search_preview",
    "web_search_2025_08_26",
    "file_search",
    "code_interpreter",
    "computer_use_preview",
    "image_generation",
    "local_shell",
    "shell",
    "mcp",
    "tool_search",
}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TextPart(_Strict):
    type: Literal["input_text", "output_text"]
    text: str
    annotations: list[Any] | None = None
    logprobs: list[Any] | None = None


class MessageItem(_Strict):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[TextPart]
    id: str | None = None
    status: str | None = None
    phase: str | None = Field(None, description="passed back by Codex: no effect")

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts(cls, value: Any) -> Any:
        for part in value if isinstance(value, list) else []:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind not in ("input_text", "output_text"):
                raise text_only(kind)
        return value

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class FunctionCallItem(_Strict):
    type: Literal["function_call"]
    call_id: str = Field(min_length=1, max_length=256)
    name: str = Field(min_length=1, max_length=256)
    arguments: str
    namespace: str | None = None
    id: str | None = None
    status: str | None = None


class FunctionCallOutputItem(_Strict):
    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1, max_length=256)
    output: str | list[TextPart]
    id: str | None = None
    status: str | None = None

    @field_validator("output", mode="before")
    @classmethod
    def _text_parts(cls, value: Any) -> Any:
        return MessageItem._text_parts(value)

    def text(self) -> str:
        return self.output if isinstance(self.output, str) else "".join(p.text for p in self.output)


class ReasoningText(_Strict):
    type: Literal["reasoning_text", "summary_text"]
    text: str


class ReasoningItem(_Strict):
    type: Literal["reasoning"]
    id: str | None = None
    summary: list[ReasoningText] = Field(default_factory=list)
    content: list[ReasoningText] | None = None
    encrypted_content: str | None = Field(None, description="opaque; not read")
    status: str | None = None


InputItem = Annotated[
    MessageItem | FunctionCallItem | FunctionCallOutputItem | ReasoningItem,
    Field(discriminator="type"),
]


class FunctionTool(_Strict):
    type: Literal["function"]
    name: str = Field(min_length=1, max_length=128)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = Field(None, description="no effect unless the call is forced")
    defer_loading: bool | None = Field(None, description="no effect: every tool is listed")


class NamespaceTool(_Strict):
    type: Literal["namespace"]
    name: str = Field(min_length=1, max_length=128)
    description: str | None = None
    tools: list[FunctionTool] = Field(max_length=512)


class HostedTool(BaseModel):
    """A tool OpenAI's servers run: left out of the prompt (named in the response)."""

    model_config = ConfigDict(extra="allow")
    type: str


def _tool(value: Any) -> Any:
    kind = value.get("type") if isinstance(value, dict) else None
    if kind in ("function", "namespace"):
        return value
    if isinstance(kind, str) and kind in HOSTED_TOOLS:
        return HostedTool.model_validate(value)
    raise ValueError(f"tools of type {kind!r} are not supported (function and namespace tools)")


class NamedFunction(_Strict):
    type: Literal["function"]
    name: str = Field(min_length=1, max_length=256)


class Reasoning(_Strict):
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = Field(
        None, description="none: thinking off (where the template has a switch); else on"
    )
    summary: Literal["auto", "concise", "detailed", "none"] | None = Field(
        None, description="no effect: reasoning comes back whole, as reasoning_text"
    )


class TextFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = Field(None, max_length=64)
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None
    description: str | None = None


class TextConfig(_Strict):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = Field(
        None, description="no effect: the served model has no verbosity control"
    )


def thinking_switch(reasoning: Reasoning | None) -> bool | None:
    """The template's thinking switch `reasoning.effort` sets (None: the default)."""
    effort = reasoning.effort if reasoning else None
    return None if effort is None else effort != "none"


class ResponsesPrefix(_Strict):
    """The part of a request that becomes the prompt, up to where requests differ: how
    a warm prompt is written in this API's shape. `input` holds the leading items every
    request starts with (Codex's `developer` messages; often no more, since the user's
    words come next); `reasoning`, because its effort switches the chat template.
    Rendered by `to_chat`, exactly as a request is."""

    instructions: str | None = None
    input: str | Annotated[list[InputItem], Field(max_length=MAX_PREFIX_ITEMS)] | None = None
    tools: list[Any] | None = Field(None, max_length=512)
    reasoning: Reasoning | None = None

    @model_validator(mode="after")
    def _something_to_render(self) -> ResponsesPrefix:
        if not (self.instructions or self.input or self.tools):
            raise ValueError("give at least one of instructions, input and tools")
        return self

    @field_validator("tools", mode="before")
    @classmethod
    def _known_tools(cls, value: Any) -> Any:
        if isinstance(value, list):
            return [_tool(t) for t in value]
        return value

    @field_validator("tools")
    @classmethod
    def _typed_tools(cls, value: list[Any] | None) -> list[Any] | None:
        out: list[Any] = []
        for tool in value or []:
            if isinstance(tool, dict):
                model = FunctionTool if tool.get("type") == "function" else NamespaceTool
                tool = model.model_validate(tool)
            out.append(tool)
        return out if value is not None else None

    @field_validator("input", mode="before")
    @classmethod
    def _typed_items(cls, value: Any) -> Any:
        # Messages may leave out their `type`.
        if isinstance(value, list):
            return [
                {**i, "type": "message"} if isinstance(i, dict) and "type" not in i else i
                for i in value
            ]
        return value

    def hosted_tools(self) -> list[str]:
        return [t.type for t in self.tools or [] if isinstance(t, HostedTool)]

    def options(self) -> ChatOptions:
        return ChatOptions(thinking=thinking_switch(self.reasoning))

    def chat(self) -> ChatPrompt:
        return to_chat(self)


class ResponsesPrompt(ResponsesPrefix):
    """The part of a request that becomes the prompt."""

    input: str | list[InputItem]


class ResponsesRequest(ResponsesPrompt):
    """Body of `POST /v1/responses`."""

    model: str = Field(min_length=1, max_length=256)
    stream: bool = False
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    tool_choice: Literal["none", "auto", "required"] | NamedFunction | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    store: bool | None = Field(None, description="false: nothing is stored (true is refused)")
    include: list[Literal["reasoning.encrypted_content"]] | None = Field(
        None, description="no effect: reasoning comes back as text, nothing is encrypted"
    )
    prompt_cache_key: str | None = Field(
        None, max_length=1024, description="a session key for a router; no effect here"
    )
    client_metadata: dict[str, str] | None = Field(None, description="no effect")
    metadata: dict[str, str] | None = Field(None, max_length=16, description="echoed back")
    service_tier: Literal["auto", "default"] | None = Field(None, description="no effect")
    truncation: Literal["disabled"] | None = None
    user: str | None = Field(None, max_length=256, description="recorded in the daemon's logs")
    safety_identifier: str | None = Field(None, max_length=256, description="as `user`")
    cache_salt: str | None = Field(
        None,
        min_length=1,
        max_length=256,
        description="vLLM's, as a warmfleet extension: this request's cache blocks are "
        "keyed apart from every request without the same salt (isolation within a tenant)",
    )

    @field_validator("store")
    @classmethod
    def _nothing_stored(cls, value: bool | None) -> bool | None:
        if value:
            raise ValueError("this server stores no responses; send store: false")
        return value

    def options(self) -> ChatOptions:
        choice: str | dict[str, Any] | None = None
        if isinstance(self.tool_choice, NamedFunction):
            choice = {"type": "function", "function": {"name": self.tool_choice.name}}
        elif self.tool_choice is not None:
            choice = self.tool_choice
        elif self.chat_tools():
            choice = "auto"
        fmt = self.text.format if self.text else None
        return ChatOptions(
            tool_choice=choice,
            parallel_tool_calls=self.parallel_tool_calls,
            json_schema=fmt.schema_ or {}
            if fmt is not None and fmt.type == "json_schema"
            else None,
            json_object=fmt is not None and fmt.type == "json_object",
            thinking=thinking_switch(self.reasoning),
        )

    def chat_tools(self) -> list[Any]:
        return [t for t in self.tools or [] if not isinstance(t, HostedTool)]


def to_chat(prompt: ResponsesPrefix) -> ChatPrompt:
    """The chat messages and tools of a Responses prompt."""
    items: list[Any] = (
        [MessageItem(role="user", content=prompt.input)]
        if isinstance(prompt.input, str)
        else list(prompt.input or [])
    )
    system = [prompt.instructions] if prompt.instructions else []
    while items and isinstance(items[0], MessageItem) and items[0].role in ("system", "developer"):
        system.append(items.pop(0).text())
    messages: list[dict[str, Any]] = []
    if system:
        messages.append({"role": "system", "content": "\n\n".join(system)})
    reasoning: list[str] = []
    for item in items:
        if isinstance(item, ReasoningItem):
            parts = item.content if item.content else item.summary
            reasoning.append("".join(p.text for p in parts))
        elif isinstance(item, FunctionCallItem):
            name = f"{item.namespace}.{item.name}" if item.namespace else item.name
            call = {
                "id": item.call_id,
                "type": "function",
                "function": {"name": name, "arguments": item.arguments or "{}"},
            }
            last = messages[-1] if messages else None
            if last is None or last["role"] != "assistant":
                last = {"role": "assistant", "content": ""}
                messages.append(last)
            last.setdefault("tool_calls", []).append(call)
        elif isinstance(item, FunctionCallOutputItem):
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": item.text()})
        else:
            role = "system" if item.role == "developer" else item.role
            messages.append({"role": role, "content": item.text()})
        if reasoning and messages and messages[-1]["role"] == "assistant":
            messages[-1]["reasoning_content"] = "\n\n".join(reasoning)
            reasoning = []
    tools: list[dict[str, Any]] = []
    names: dict[str, tuple[str | None, str]] = {}
    for tool in prompt.tools or []:
        if isinstance(tool, FunctionTool):
            tools.append(function_tool(tool.name, tool.description, tool.parameters))
            names[tool.name] = (None, tool.name)
        elif isinstance(tool, NamespaceTool):
            for inner in tool.tools:
                flat = f"{tool.name}.{inner.name}"
                tools.append(function_tool(flat, inner.description, inner.parameters))
                names[flat] = (tool.name, inner.name)
    return ChatPrompt(messages, tools or None, (), names)
