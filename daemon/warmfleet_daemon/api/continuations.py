"""Each API's conversation plus the answer it returned, as the client sends them back on
its next turn: what `next_turn` prefills at idle priority once a response has ended.
The answer goes through the API's own request translation (Anthropic blocks, Responses
items), so the next request renders exactly the same tokens."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import TypeAdapter

from warmfleet_common.agent_apis.anthropic import Message, MessagesRequest
from warmfleet_common.agent_apis.responses import InputItem, MessageItem, ResponsesRequest
from warmfleet_common.contract import ChatMessage
from warmfleet_daemon.api.schemas import ChatCompletionRequest
from warmfleet_daemon.runtime.assembly import Ready
from warmfleet_daemon.warming.next_turn import Continuation, tool_call_ids

_ITEMS = TypeAdapter(list[InputItem])


def chat(ready: Ready, body: ChatCompletionRequest, answer: dict[str, Any], salt: bytes) -> None:
    """After a chat completion (one choice): `answer` is its message, content and
    tool calls as returned (reasoning is not sent back by OpenAI clients); `salt`: the
    request's, which the next turn is keyed with too."""
    if ready.next_turn is None or body.n != 1:
        return

    def build() -> Continuation:
        message = ChatMessage.model_validate(
            {"role": "assistant", "content": answer.get("content"), **_calls(answer)}
        )
        messages = [m.as_template_message() for m in [*body.messages, message]]
        tools = [t.model_dump(exclude_none=True) for t in body.tools] if body.tools else None
        ids = tool_call_ids(answer.get("tool_calls") or [])
        return Continuation(messages, tools, None, ids, salt)

    ready.next_turn.after(build)


def messages(
    ready: Ready, body: MessagesRequest, blocks: Sequence[dict[str, Any]], salt: bytes
) -> None:
    """After an Anthropic message: `blocks` is its content as returned."""
    if ready.next_turn is None or not blocks:
        return

    def build() -> Continuation:
        answer = Message.model_validate({"role": "assistant", "content": list(blocks)})
        prompt = body.model_copy(update={"messages": [*body.messages, answer]}).chat()
        ids = tuple(b["id"] for b in blocks if b.get("type") == "tool_use")
        return Continuation(
            prompt.messages, prompt.tools, prompt.template_kwargs(body.options()), ids, salt
        )

    ready.next_turn.after(build)


def responses(
    ready: Ready, body: ResponsesRequest, output: Sequence[dict[str, Any]], salt: bytes
) -> None:
    """After a Responses response: `output` is its items as returned."""
    if ready.next_turn is None or not output:
        return

    def build() -> Continuation:
        given: list[Any] = (
            [MessageItem(role="user", content=body.input)]
            if isinstance(body.input, str)
            else list(body.input)
        )
        items = [*given, *_ITEMS.validate_python(list(output))]
        prompt = body.model_copy(update={"input": items}).chat()
        ids = tuple(i["call_id"] for i in output if i.get("type") == "function_call")
        return Continuation(
            prompt.messages, prompt.tools, prompt.template_kwargs(body.options()), ids, salt
        )

    ready.next_turn.after(build)


def _calls(answer: dict[str, Any]) -> dict[str, Any]:
    calls = answer.get("tool_calls")
    return {"tool_calls": list(calls)} if calls else {}


class ChatAnswer:
    """Choice 0's message, put together from a chat completion stream's deltas as a
    client does."""

    def __init__(self) -> None:
        self.content = ""
        self.calls: list[dict[str, Any]] = []

    def add(self, rendered: Sequence[dict[str, Any]]) -> None:
        for choice in rendered:
            delta = choice.get("delta") or {}
            self.content += delta.get("content") or ""
            for call in delta.get("tool_calls") or []:
                self.calls.append({k: v for k, v in call.items() if k != "index"})

    def message(self) -> dict[str, Any]:
        out: dict[str, Any] = {"content": self.content or None}
        if self.calls:
            out["tool_calls"] = self.calls
        return out
