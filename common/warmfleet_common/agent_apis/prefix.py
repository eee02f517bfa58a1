"""The static part of a request, as a warm prompt in its API's shape: what
`warmfleet warm-prompts capture` keeps of an agent's first request.

Static is what comes before the first user message: the system prompt (Anthropic's
`system`; Responses' `instructions` and leading `developer`/`system` items; chat's
leading messages) and the tools, plus the switches that change how the template
renders them (`thinking`, `reasoning.effort`). The user message carries the user's
words, and what agents put after it (Claude Code's environment, a `system`-role
message; Codex's `<environment_context>` user message) changes with the directory and
the day, so it is left out: the warm prompt is then a strict prefix of every request
the agent starts with the same system prompt and tools.

The entry keeps only what renders, in the plainest form that renders the same: text
blocks and parts joined as `to_chat` joins them, so `system`, `instructions` and
message contents are strings (what a WarmPromptSet's schema takes); Claude Code's
billing header, `cache_control`, deferred tools, hosted tools and item ids are dropped
(none of them reaches the template).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from warmfleet_common.agent_apis import anthropic, responses
from warmfleet_common.agent_apis.shapes import ApiName
from warmfleet_common.contract import ChatMessage, ToolDefinition, WarmPrompt


class NothingToWarm(ValueError):
    """The request has no static part (no system prompt, leading messages or tools)."""


def agent_name(api: ApiName, user_agent: str) -> str:
    """The agent's name where its User-Agent says it, else the API's (`chat-agent`): a
    captured prompt's default name, and the client a learned one is named after."""
    agent = user_agent.lower()
    if agent.startswith("claude-cli/") or "claude-code" in agent:
        return "claude-code"
    if agent.startswith("codex"):
        return "codex"
    if agent.startswith("opencode/"):
        return "opencode"
    if agent.startswith("qwencode/"):
        return "qwen-code"
    return f"{api}-agent"


def warm_prompt(api: ApiName, body: Mapping[str, Any], name: str) -> WarmPrompt:
    """The warm prompt of a request body of `api`. Raises ValueError (pydantic's
    ValidationError, or NothingToWarm) when the body cannot be read as that API's."""
    entry: dict[str, Any]
    if api == "anthropic":
        entry = {"anthropic": _anthropic(body)}
    elif api == "responses":
        entry = {"responses": _responses(body)}
    else:
        entry = _chat(body)
    return WarmPrompt.model_validate({"name": name, **entry})


def _anthropic(body: Mapping[str, Any]) -> dict[str, Any]:
    prompt = anthropic.MessagesPrompt.model_validate(
        {k: body[k] for k in ("system", "messages", "tools", "thinking") if k in body}
    )
    out: dict[str, Any] = {}
    system = anthropic.system_blocks(prompt.system)
    if system:
        out["system"] = anthropic.BLOCK_SEPARATOR.join(b.text for b in system)
    leading = _before_first_user(prompt.messages)
    if leading:
        out["messages"] = [_anthropic_message(m) for m in leading]
    tools = [t for t in prompt.tools or [] if not t.defer_loading]
    if tools:
        out["tools"] = [
            t.model_dump(include={"name", "description", "input_schema"}, exclude_none=True)
            for t in tools
        ]
    if prompt.thinking is not None:
        out["thinking"] = prompt.thinking.model_dump(exclude={"display"}, exclude_none=True)
    return _nonempty(out)


def _anthropic_message(message: anthropic.Message) -> dict[str, Any]:
    blocks = message.blocks()
    if all(isinstance(b, anthropic.TextBlock) for b in blocks):
        text = anthropic.BLOCK_SEPARATOR.join(b.text for b in blocks)
        return {"role": message.role, "content": text}
    content = [b.model_dump(exclude={"cache_control"}, exclude_none=True) for b in blocks]
    return {"role": message.role, "content": content}


def _responses(body: Mapping[str, Any]) -> dict[str, Any]:
    prompt = responses.ResponsesPrompt.model_validate(
        {k: body[k] for k in ("instructions", "input", "tools", "reasoning") if k in body}
    )
    out: dict[str, Any] = {}
    if prompt.instructions:
        out["instructions"] = prompt.instructions
    items = [] if isinstance(prompt.input, str) else prompt.input or []
    leading = _before_first_user(items)
    if leading:
        out["input"] = [_responses_item(i) for i in leading]
    tools = [_responses_tool(t) for t in prompt.tools or []]
    if any(tools):
        out["tools"] = [t for t in tools if t]
    if prompt.reasoning is not None and prompt.reasoning.effort is not None:
        out["reasoning"] = {"effort": prompt.reasoning.effort}
    return _nonempty(out)


def _responses_item(item: Any) -> dict[str, Any]:
    if isinstance(item, responses.MessageItem):
        return {"type": "message", "role": item.role, "content": item.text()}
    return dict(item.model_dump(exclude={"id", "status"}, exclude_none=True))


def _responses_tool(tool: Any) -> dict[str, Any] | None:
    """A tool as it renders (None: a hosted tool, left out of the prompt)."""
    if isinstance(tool, responses.FunctionTool):
        return tool.model_dump(
            include={"type", "name", "description", "parameters"}, exclude_none=True
        )
    if isinstance(tool, responses.NamespaceTool):
        out = tool.model_dump(include={"type", "name", "description"}, exclude_none=True)
        out["tools"] = [_responses_tool(t) for t in tool.tools]
        return dict(out)
    return None


def _chat(body: Mapping[str, Any]) -> dict[str, Any]:
    raw = body.get("messages")
    if not isinstance(raw, list):
        raise NothingToWarm("the request has no messages")
    messages = [ChatMessage.model_validate(m) for m in raw]
    leading = _before_first_user(messages)
    if not leading:
        raise NothingToWarm(
            "the request has no system prompt (no message before its first user message): "
            "nothing every request shares to warm"
        )
    out: dict[str, Any] = {"messages": [m.as_template_message() for m in leading]}
    tools = body.get("tools")
    if tools:
        out["tools"] = [
            ToolDefinition.model_validate(t).model_dump(exclude_none=True) for t in tools
        ]
    return out


def _before_first_user(messages: Any) -> list[Any]:
    out = []
    for message in messages:
        if getattr(message, "role", None) == "user":
            break
        out.append(message)
    return out


def _nonempty(shape: dict[str, Any]) -> dict[str, Any]:
    if not shape:
        raise NothingToWarm(
            "the request has no system prompt, leading messages or tools: nothing every "
            "request shares to warm"
        )
    return shape
