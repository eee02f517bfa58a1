"""What the capture endpoint answers, in the shape of the API it was asked in: a short,
complete reply (so Claude Code, Codex and the SDKs print it and stop cleanly rather
than retry, as they do after an error), or an error the client reports.

Each reply is a whole response or the API's whole event stream, ending the way each
client waits for: Anthropic's `message_stop`, the Responses API's `response.completed`
(Codex retries a stream that ends without it), chat's `[DONE]`."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

from warmfleet_common.agent_apis.shapes import ApiName


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def reply(api: ApiName, model: str, text: str) -> dict[str, Any]:
    """A whole response carrying `text`."""
    if api == "anthropic":
        return _anthropic_message(model, text)
    if api == "responses":
        return _response(model, text, "completed")
    return {
        "id": _id("chatcmpl"),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
    }


def stream(api: ApiName, model: str, text: str) -> Iterator[bytes]:
    """The same reply as the API's server-sent events."""
    if api == "anthropic":
        return _anthropic_events(model, text)
    if api == "responses":
        return _responses_events(model, text)
    return _chat_chunks(model, text)


def error(api: ApiName, message: str) -> dict[str, Any]:
    """An invalid-request error body in the API's shape."""
    if api == "anthropic":
        return {"type": "error", "error": {"type": "invalid_request_error", "message": message}}
    return {
        "error": {"message": message, "type": "invalid_request_error", "param": None, "code": None}
    }


def _sse(event: str | None, data: dict[str, Any] | str) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {payload}\n\n".encode()


def _anthropic_usage() -> dict[str, int]:
    return {
        "input_tokens": 0,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "output_tokens": 0,
    }


def _anthropic_message(model: str, text: str) -> dict[str, Any]:
    return {
        "id": _id("msg"),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [{"type": "text", "text": text}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": _anthropic_usage(),
    }


def _anthropic_events(model: str, text: str) -> Iterator[bytes]:
    start = {**_anthropic_message(model, ""), "content": [], "stop_reason": None}
    yield _sse("message_start", {"type": "message_start", "message": start})
    block = {"type": "text", "text": ""}
    yield _sse(
        "content_block_start", {"type": "content_block_start", "index": 0, "content_block": block}
    )
    delta = {"type": "text_delta", "text": text}
    yield _sse("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta})
    yield _sse("content_block_stop", {"type": "content_block_stop", "index": 0})
    yield _sse(
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn", "stop_sequence": None},
            "usage": _anthropic_usage(),
        },
    )
    yield _sse("message_stop", {"type": "message_stop"})


def _output_message(item_id: str, text: str, status: str) -> dict[str, Any]:
    part = {"type": "output_text", "text": text, "annotations": []}
    return {
        "type": "message",
        "id": item_id,
        "role": "assistant",
        "status": status,
        "content": [part] if text or status == "completed" else [],
    }


def _response(model: str, text: str, status: str, response_id: str | None = None) -> dict[str, Any]:
    done = status == "completed"
    return {
        "id": response_id or _id("resp"),
        "object": "response",
        "created_at": int(time.time()),
        "model": model,
        "status": status,
        "output": [_output_message(_id("msg"), text, "completed")] if done else [],
        "error": None,
        "incomplete_details": None,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": {
            "input_tokens": 0,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 0,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 0,
        }
        if done
        else None,
    }


def _responses_events(model: str, text: str) -> Iterator[bytes]:
    response_id, item_id = _id("resp"), _id("msg")
    sequence = iter(range(1 << 30))

    def event(kind: str, **data: Any) -> bytes:
        return _sse(kind, {"type": kind, "sequence_number": next(sequence), **data})

    pending = _response(model, "", "in_progress", response_id)
    yield event("response.created", response=pending)
    yield event("response.in_progress", response=pending)
    yield event(
        "response.output_item.added",
        output_index=0,
        item=_output_message(item_id, "", "in_progress"),
    )
    part = {"type": "output_text", "text": "", "annotations": []}
    where = {"item_id": item_id, "output_index": 0, "content_index": 0}
    yield event("response.content_part.added", **where, part=part)
    yield event("response.output_text.delta", **where, delta=text)
    yield event("response.output_text.done", **where, text=text)
    yield event("response.content_part.done", **where, part={**part, "text": text})
    item = _output_message(item_id, text, "completed")
    yield event("response.output_item.done", output_index=0, item=item)
    done = _response(model, text, "completed", response_id)
    done["output"] = [item]
    yield event("response.completed", response=done)


def _chat_chunks(model: str, text: str) -> Iterator[bytes]:
    head = {
        "id": _id("chatcmpl"),
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
    }

    def chunk(delta: dict[str, Any], finish: str | None) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        return _sse(None, {**head, "choices": [choice]})

    yield chunk({"role": "assistant", "content": text}, None)
    yield chunk({}, "stop")
    yield _sse(None, "[DONE]")
