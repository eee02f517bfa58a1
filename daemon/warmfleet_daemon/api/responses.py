"""From engine output to OpenAI Responses API responses: output items (`reasoning`,
`message`, `function_call`), usage with `input_tokens_details.cached_tokens`, and the
stream's events, each with its `sequence_number`, ending in `response.completed` (its
status `incomplete` when max_output_tokens or the context cut it) or `response.failed`
(generation failed)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from typing import Any

from warmfleet_common.agent_apis.responses import NamedFunction, ResponsesRequest
from warmfleet_daemon.api import agent_requests
from warmfleet_daemon.api import generation as gen
from warmfleet_daemon.api.output import Piece, merge
from warmfleet_daemon.engine.requests import Event, Usage
from warmfleet_daemon.runtime.assembly import Ready

# While a long prompt is prefilled: a `keepalive` event, as OpenAI's own Responses API
# sends on long requests. Codex restarts a stream after 300 s without an event (an SSE
# comment does not count) and ignores event types it does not know.
KEEP_ALIVE_S = 5.0


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def _choice(body: ResponsesRequest) -> Any:
    choice = body.tool_choice
    return choice.model_dump() if isinstance(choice, NamedFunction) else (choice or "auto")


def envelope(
    body: ResponsesRequest, response_id: str, model: str, created: float
) -> dict[str, Any]:
    """The response object's fields that echo the request."""
    return {
        "id": response_id,
        "object": "response",
        "created_at": created,
        "model": model,
        "status": "in_progress",
        "output": [],
        "error": None,
        "incomplete_details": None,
        "instructions": body.instructions,
        "metadata": body.metadata or {},
        "max_output_tokens": body.max_output_tokens,
        "parallel_tool_calls": body.parallel_tool_calls is not False,
        "previous_response_id": None,
        "reasoning": body.reasoning.model_dump() if body.reasoning else None,
        "store": False,
        "temperature": body.temperature,
        "top_p": body.top_p,
        "text": {"format": {"type": "text"}}
        if body.text is None
        else body.text.model_dump(by_alias=True, exclude_none=True),
        "tool_choice": _choice(body),
        "tools": [t.model_dump(exclude_none=True) for t in body.tools or []],
        "truncation": "disabled",
        "prompt_cache_key": body.prompt_cache_key,
        "user": body.user,
        "usage": None,
        # Hosted tools this server cannot run: left out of the prompt.
        "tools_left_out": body.hosted_tools(),
    }


def usage(
    ready: Ready, request: agent_requests.AgentRequest, used: Usage | None, reasoning: str
) -> dict[str, Any]:
    prompt = len(request.prompt.tokens)
    output = used.completion_tokens if used else 0
    thought = (
        len(ready.model.tokenizer.encode(reasoning, add_special_tokens=False)) if reasoning else 0
    )
    return {
        "input_tokens": prompt,
        "input_tokens_details": {
            "cached_tokens": used.cached_tokens if used else 0,
            "cache_write_tokens": 0,
        },
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": min(thought, output)},
        "total_tokens": prompt + output,
        **({"cached_tokens_by_tier": gen.tiers_of(used)} if used else {}),
    }


def item_of(piece: Piece, request: agent_requests.AgentRequest, item_id: str) -> dict[str, Any]:
    """A finished piece as an output item."""
    if piece.kind == "thinking":
        return {
            "type": "reasoning",
            "id": item_id,
            "summary": [],
            "content": [{"type": "reasoning_text", "text": piece.text}],
            "encrypted_content": None,
            "status": "completed",
        }
    if piece.kind == "tool_call":
        assert piece.call is not None
        function = piece.call["function"]
        namespace, name = request.chat.tool_names.get(function["name"], (None, function["name"]))
        item = {
            "type": "function_call",
            "id": item_id,
            "call_id": _id("call"),
            "name": name,
            "arguments": function["arguments"],
            "status": "completed",
        }
        if namespace is not None:
            item["namespace"] = namespace
        return item
    return {
        "type": "message",
        "id": item_id,
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": piece.text, "annotations": [], "logprobs": []}],
    }


def _finish(response: dict[str, Any], final: Event) -> None:
    if final.finish_reason in ("length", "prefilled"):
        response["status"] = "incomplete"
        response["incomplete_details"] = {"reason": "max_output_tokens"}
    else:
        response["status"] = "completed"
    response["completed_at"] = time.time()


def response(
    ready: Ready,
    body: ResponsesRequest,
    request: agent_requests.AgentRequest,
    model: str,
    text: str,
    final: Event,
) -> dict[str, Any]:
    """The whole response (`POST /v1/responses` without streaming)."""
    splitter = request.splitter(ready)
    pieces = merge([*splitter.feed(text), *splitter.finish()])
    prefixes = {"thinking": "rs", "text": "msg", "tool_call": "fc"}
    out = envelope(body, _id("resp"), model, time.time())
    out["output"] = [item_of(p, request, _id(prefixes[p.kind])) for p in pieces]
    reasoning = "".join(p.text for p in pieces if p.kind == "thinking")
    out["usage"] = usage(ready, request, final.usage, reasoning)
    _finish(out, final)
    return out


class _Stream:
    """Numbers events and keeps the open output item."""

    def __init__(self, request: agent_requests.AgentRequest) -> None:
        self.request = request
        self.sequence = 0
        self.output: list[dict[str, Any]] = []
        self.open: Piece | None = None  # kind and text so far
        self.open_id = ""

    def event(self, kind: str, **fields: Any) -> bytes:
        data = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return f"event: {kind}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()

    def close(self) -> list[bytes]:
        piece, self.open = self.open, None
        if piece is None:
            return []
        item = item_of(piece, self.request, self.open_id)
        index = len(self.output)
        self.output.append(item)
        where = {"item_id": self.open_id, "output_index": index, "content_index": 0}
        if piece.kind == "thinking":
            part = {"type": "reasoning_text", "text": piece.text}
            done = [self.event("response.reasoning_text.done", **where, text=piece.text)]
        else:
            part = item["content"][0]
            done = [self.event("response.output_text.done", **where, text=piece.text, logprobs=[])]
        return [
            *done,
            self.event("response.content_part.done", **where, part=part),
            self.event("response.output_item.done", output_index=index, item=item),
        ]

    def piece(self, piece: Piece) -> list[bytes]:
        out: list[bytes] = []
        index = len(self.output)
        if piece.kind == "tool_call":
            out += self.close()
            index = len(self.output)
            item = item_of(piece, self.request, _id("fc"))
            self.output.append(item)
            where = {"item_id": item["id"], "output_index": index}
            out.append(
                self.event(
                    "response.output_item.added",
                    output_index=index,
                    item={**item, "arguments": "", "status": "in_progress"},
                )
            )
            out.append(
                self.event(
                    "response.function_call_arguments.delta", **where, delta=item["arguments"]
                )
            )
            out.append(
                self.event(
                    "response.function_call_arguments.done", **where, arguments=item["arguments"]
                )
            )
            out.append(self.event("response.output_item.done", output_index=index, item=item))
            return out
        if self.open is None or self.open.kind != piece.kind:
            out += self.close()
            index = len(self.output)
            self.open_id = _id("rs" if piece.kind == "thinking" else "msg")
            self.open = Piece(piece.kind, "")
            skeleton = item_of(self.open, self.request, self.open_id)
            skeleton["status"] = "in_progress"
            skeleton["content"] = []
            where = {"item_id": self.open_id, "output_index": index, "content_index": 0}
            part = (
                {"type": "reasoning_text", "text": ""}
                if piece.kind == "thinking"
                else {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            )
            out.append(self.event("response.output_item.added", output_index=index, item=skeleton))
            out.append(self.event("response.content_part.added", **where, part=part))
        self.open = Piece(piece.kind, self.open.text + piece.text)
        if piece.text:
            where = {"item_id": self.open_id, "output_index": index, "content_index": 0}
            kind = (
                "response.reasoning_text.delta"
                if piece.kind == "thinking"
                else "response.output_text.delta"
            )
            extra: dict[str, Any] = {} if piece.kind == "thinking" else {"logprobs": []}
            out.append(self.event(kind, **where, delta=piece.text, **extra))
        return out


async def stream(
    ready: Ready,
    body: ResponsesRequest,
    request: agent_requests.AgentRequest,
    model: str,
    answered: Callable[[list[dict[str, Any]]], None] | None = None,
) -> AsyncGenerator[bytes, None]:
    """The response as the Responses API's server-sent events; `answered` gets the
    output items once the answer is complete."""
    state = _Stream(request)
    current = envelope(body, _id("resp"), model, time.time())
    yield state.event("response.created", response=current)
    yield state.event("response.in_progress", response=current)
    splitter = request.splitter(ready)
    reasoning = ""
    final: Event | None = None
    try:
        events = gen.choice_events(ready, [request.generation])
        async with aclosing(events), aclosing(gen.heartbeat(events, KEEP_ALIVE_S)) as beats:
            async for item in beats:
                if item is None:
                    yield state.event("keepalive")
                    continue
                _, event = item
                if event.finish_reason in ("error", "abort"):
                    raise RuntimeError(f"generation failed: {event.error or event.finish_reason}")
                for piece in splitter.feed(event.text):
                    reasoning += piece.text if piece.kind == "thinking" else ""
                    for chunk in state.piece(piece):
                        yield chunk
                if event.finish_reason is not None:
                    final = event
        assert final is not None
        for piece in splitter.finish():
            reasoning += piece.text if piece.kind == "thinking" else ""
            for chunk in state.piece(piece):
                yield chunk
        for chunk in state.close():
            yield chunk
    except Exception as exc:  # the stream ends in response.failed, never just stops
        current.update(
            status="failed",
            output=state.output,
            error={"code": "server_error", "message": f"{type(exc).__name__}: {exc}"},
        )
        yield state.event("response.failed", response=current)
        return
    current["output"] = state.output
    current["usage"] = usage(ready, request, final.usage, reasoning)
    _finish(current, final)
    # Also when max_output_tokens cut it (status "incomplete"): Codex and the SDK's
    # stream helper treat a stream without response.completed as failed.
    yield state.event("response.completed", response=current)
    if answered is not None and final.finish_reason in ("stop", "length"):
        answered(state.output)
