"""The routes the router proxies, as a table: what each one's request becomes for the
keyer (its prompt, as the daemon renders it), where its response says how many prompt
tokens were cached, and which stream events carry output. Adding a route (Anthropic's
`/v1/messages`, OpenAI's `/v1/responses`) is an entry here plus its request-to-prompt
function; the proxy, the keyer and the policies do not change. Plain Python, no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from warmfleet_common.contract import ChatMessage, ToolDefinition
from warmfleet_router.keys import (
    EMPTY,
    ChatPrompt,
    Keyer,
    Prompt,
    RequestBlocks,
    TextPrompt,
    prompt_blocks,
)


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    cached_tokens: int


@dataclass(frozen=True)
class ProxiedRoute:
    path: str
    name: str  # in plans and logs
    # The request's prompt as the daemon renders it; None when the body says none (the
    # daemon answers such a request with its own 400). May raise ValueError/TypeError.
    prompt_of: Callable[[Mapping[str, Any]], Prompt | None]
    # Prompt and cached tokens from a response body or a stream event (a JSON object).
    usage_of: Callable[[Mapping[str, Any]], Usage | None]
    # Whether a stream event (a JSON object) carries output: until one does, a failure
    # is still retried elsewhere.
    carries_output: Callable[[Mapping[str, Any]], bool]


def chat_prompt(body: Mapping[str, Any]) -> Prompt | None:
    messages = [ChatMessage.model_validate(m).as_template_message() for m in body["messages"]]
    raw_tools = body.get("tools") or None
    tools = (
        [ToolDefinition.model_validate(t).model_dump(exclude_none=True) for t in raw_tools]
        if raw_tools
        else None
    )
    return ChatPrompt(messages, tools)


def completion_prompt(body: Mapping[str, Any]) -> Prompt | None:
    prompt = single_prompt(body.get("prompt"))
    return TextPrompt(prompt) if prompt is not None else None


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


def openai_usage(document: Mapping[str, Any]) -> Usage | None:
    """`usage.prompt_tokens` and `usage.prompt_tokens_details.cached_tokens`."""
    usage = document.get("usage")
    if not isinstance(usage, dict):
        return None
    details = usage.get("prompt_tokens_details")
    prompt, cached = usage.get("prompt_tokens"), (details or {}).get("cached_tokens")
    if not isinstance(prompt, int) or isinstance(prompt, bool):
        return None
    return Usage(prompt, cached if isinstance(cached, int) and not isinstance(cached, bool) else 0)


def openai_output(event: Mapping[str, Any]) -> bool:
    """Chat and completion chunks: text, a tool call, a finish, usage or an error."""
    if event.get("error") or event.get("usage"):
        return True
    choices = event.get("choices")
    for choice in choices if isinstance(choices, list) else []:
        if not isinstance(choice, dict):
            return True  # unexpected: pass it on
        delta = choice.get("delta")
        delta = delta if isinstance(delta, dict) else {}
        if choice.get("finish_reason") or choice.get("text") or delta.get("tool_calls"):
            return True
        if delta.get("content"):
            return True
    return False


CHAT = ProxiedRoute(
    "/v1/chat/completions", "chat", chat_prompt, openai_usage, openai_output
)  # fmt: skip
COMPLETION = ProxiedRoute(
    "/v1/completions", "completion", completion_prompt, openai_usage, openai_output
)
ROUTES: tuple[ProxiedRoute, ...] = (CHAT, COMPLETION)
BY_NAME = {r.name: r for r in ROUTES}


def request_blocks(
    keyer: Keyer, route: str | ProxiedRoute, body: Mapping[str, Any]
) -> RequestBlocks:
    """The blocks of a request body on `route`; EMPTY when it has no prompt the router
    can render (the daemon will answer it with its own 400)."""
    spec = BY_NAME[route] if isinstance(route, str) else route
    try:
        prompt = spec.prompt_of(body)
    except (KeyError, TypeError, ValueError, ValidationError):
        return EMPTY
    return prompt_blocks(keyer, prompt) if prompt is not None else EMPTY


# -- what the router's OpenAPI document says of the bodies ---------------------------
# The backends validate the rest and answer their own 400s, which the document lists.


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class TextPart(_Open):
    type: Literal["text"]
    text: str


class Message(_Open):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None


class ChatBody(_Open):
    """OpenAI's chat completion request (the backend's other parameters pass through)."""

    model: str = Field(min_length=1)
    messages: list[Message] = Field(min_length=1)
    stream: bool = False
    max_tokens: int | None = Field(None, ge=1)


class CompletionBody(_Open):
    """OpenAI's completion request (the backend's other parameters pass through)."""

    model: str = Field(min_length=1)
    prompt: str | list[int] | list[str] | list[list[int]]
    stream: bool = False
    max_tokens: int | None = Field(None, ge=1)


BODIES: dict[str, type[BaseModel]] = {CHAT.name: ChatBody, COMPLETION.name: CompletionBody}
