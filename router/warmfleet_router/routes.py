"""The routes the router proxies, as a table: what each one's request becomes for the
keyer (its prompt, as the daemon renders it), where its response says how many prompt
tokens were cached, which stream events carry output, and whose error shape the
router's own errors take. OpenAI's chat and completions, Anthropic's Messages (Claude
Code) and OpenAI's Responses (Codex): agent requests are translated by the same
`warmfleet_common.agent_apis` code the daemons render them with, so their block keys are
the daemons'. Plain Python, no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal, TypeGuard

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from warmfleet_common.agent_apis.anthropic import CountTokensRequest, MessagesRequest
from warmfleet_common.agent_apis.responses import ResponsesRequest
from warmfleet_common.agent_apis.shapes import ApiName
from warmfleet_common.contract import ChatMessage, ToolDefinition
from warmfleet_common.tiers import TierTokens
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
    # cached_tokens by the tier each came from (a warmfleet daemon's
    # `usage.cached_tokens_by_tier`); None: the backend did not say.
    tiers: TierTokens | None = None
    completion_tokens: int | None = None  # generated (None: the backend did not say)


def _with_tiers(usage: Usage, document: Mapping[str, Any]) -> Usage:
    """`usage` with its served tiers, when `document` (the usage object) says them and
    they add up to its cached tokens."""
    tiers = TierTokens.parse(document.get("cached_tokens_by_tier"), total=usage.cached_tokens)
    return usage if tiers is None else replace(usage, tiers=tiers)


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
    # The API shape the route speaks (warmfleet_common.agent_apis.shapes): the router's
    # own errors on it take that API's shape (completions: chat's, OpenAI's).
    api: ApiName = "chat"


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
    counted = Usage(
        prompt,
        cached if isinstance(cached, int) and not isinstance(cached, bool) else 0,
        completion_tokens=_generated(usage.get("completion_tokens")),
    )
    return _with_tiers(counted, usage)


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


def anthropic_prompt(body: Mapping[str, Any]) -> Prompt | None:
    """An Anthropic Messages request as the daemon renders it (system blocks, tools,
    tool results, the thinking switch: `agent_apis.anthropic.to_chat`)."""
    request = (MessagesRequest if "max_tokens" in body else CountTokensRequest).model_validate(body)
    chat = request.chat()
    return ChatPrompt(chat.messages, chat.tools, chat.template_kwargs(request.options()))


def responses_prompt(body: Mapping[str, Any]) -> Prompt | None:
    """A Responses request as the daemon renders it (`agent_apis.responses.to_chat`)."""
    request = ResponsesRequest.model_validate(body)
    chat = request.chat()
    return ChatPrompt(chat.messages, chat.tools, chat.template_kwargs(request.options()))


def anthropic_usage(document: Mapping[str, Any]) -> Usage | None:
    """A message's usage (its body, `message_start`'s estimate, or `message_delta`'s
    figures): the prompt is input + cache read + cache creation tokens."""
    usage = document.get("usage")
    if document.get("type") == "message_start":
        message = document.get("message")
        usage = message.get("usage") if isinstance(message, dict) else None
    if not isinstance(usage, dict):
        return None
    uncached, cached = usage.get("input_tokens"), usage.get("cache_read_input_tokens")
    created = usage.get("cache_creation_input_tokens")
    if not (_count(uncached) and _count(cached)):
        return None
    prompt = uncached + cached + (created if _count(created) else 0)
    return _with_tiers(Usage(prompt, cached, None, _generated(usage.get("output_tokens"))), usage)


def anthropic_output(event: Mapping[str, Any]) -> bool:
    """Everything but the opening `message_start`: a `ping` during a long prefill too,
    so the client hears from the stream while it waits (the daemon pings every 5 s)."""
    return event.get("type") != "message_start"


def responses_usage(document: Mapping[str, Any]) -> Usage | None:
    """`usage.input_tokens` and `usage.input_tokens_details.cached_tokens`, of the body
    or of the `response` a `response.completed` event carries."""
    response = document.get("response") if "response" in document else document
    usage = response.get("usage") if isinstance(response, dict) else None
    prompt = usage.get("input_tokens") if isinstance(usage, dict) else None
    if not _count(prompt):
        return None
    details = usage.get("input_tokens_details")  # type: ignore[union-attr]
    cached = details.get("cached_tokens") if isinstance(details, dict) else 0
    generated = _generated(usage.get("output_tokens"))  # type: ignore[union-attr]
    return _with_tiers(Usage(prompt, cached if _count(cached) else 0, None, generated), usage)  # type: ignore[arg-type]


def responses_output(event: Mapping[str, Any]) -> bool:
    """Anything past the response's creation (`response.created`/`in_progress`)."""
    return event.get("type") not in ("response.created", "response.in_progress")


def _generated(value: Any) -> int | None:
    return value if _count(value) else None


def _count(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


CHAT = ProxiedRoute(
    "/v1/chat/completions", "chat", chat_prompt, openai_usage, openai_output
)  # fmt: skip
COMPLETION = ProxiedRoute(
    "/v1/completions", "completion", completion_prompt, openai_usage, openai_output
)
MESSAGES = ProxiedRoute(
    "/v1/messages", "messages", anthropic_prompt, anthropic_usage, anthropic_output, api="anthropic"
)
COUNT_TOKENS = ProxiedRoute(
    "/v1/messages/count_tokens",
    "count_tokens",
    anthropic_prompt,
    lambda _: None,
    lambda _: True,
    api="anthropic",
)
RESPONSES = ProxiedRoute(
    "/v1/responses",
    "responses",
    responses_prompt,
    responses_usage,
    responses_output,
    api="responses",
)
ROUTES: tuple[ProxiedRoute, ...] = (CHAT, COMPLETION, MESSAGES, COUNT_TOKENS, RESPONSES)
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


# The agent APIs' bodies as the daemons validate them (their unknown fields are 400s).
BODIES: dict[str, type[BaseModel]] = {
    CHAT.name: ChatBody,
    COMPLETION.name: CompletionBody,
    MESSAGES.name: MessagesRequest,
    COUNT_TOKENS.name: CountTokensRequest,
    RESPONSES.name: ResponsesRequest,
}
