"""Anthropic's Messages API (Claude Code): `POST /v1/messages` (also as
`/v1/messages?beta=true`, which Claude Code calls) and `/v1/messages/count_tokens`.
Errors answer in Anthropic's shape (`errors.error_json`)."""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse

from warmfleet_common.agent_apis.anthropic import (
    CountTokensRequest,
    MessagesRequest,
)
from warmfleet_common.errors import AnthropicErrorResponse
from warmfleet_daemon.api import agent_requests, anthropic, choices, continuations
from warmfleet_daemon.api import generation as gen
from warmfleet_daemon.api.deps import ReadyDep, StateDep
from warmfleet_daemon.api.errors import APIError

log = logging.getLogger(__name__)

_DESCRIPTIONS = {
    400: "Invalid request (Anthropic's error shape: invalid_request_error)",
    404: "No such model (not_found_error)",
    413: "The body is too large (request_too_large)",
    499: "The client closed the request before it was answered",
    503: "The model is loading or failed to load (overloaded_error)",
}


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    return {
        code: {"model": AnthropicErrorResponse, "description": _DESCRIPTIONS[code]}
        for code in codes
    }


router = APIRouter(prefix="/v1", responses=_errors(503))
_BETA = Query(None, description="Claude Code's `?beta=true`: the same route")


@router.post(
    "/messages",
    responses={
        200: {"content": {"text/event-stream": {"schema": {"type": "string"}}}},
        **_errors(400, 404, 413, 499),
    },
)
async def messages(
    body: MessagesRequest,
    http: Request,
    ready: ReadyDep,
    state: StateDep,
    beta: bool | None = _BETA,
) -> Any:
    _check_model(ready, body.model)
    chat = body.chat()
    request = await agent_requests.agent_request(
        ready,
        chat,
        body.options(),
        http,
        state.settings,
        max_tokens=body.max_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        top_k=body.top_k,
        stop=tuple(body.stop_sequences or ()),
        user=body.metadata.user_id[:256] if body.metadata and body.metadata.user_id else None,
        cache_salt=body.cache_salt,
    )
    salt = request.prompt.salt
    model = state.served_name()

    def answered(blocks: list[dict[str, Any]]) -> None:
        continuations.messages(ready, body, blocks, salt)

    if body.stream:
        return StreamingResponse(
            _ending_on_error(anthropic.stream(ready, request, model, answered)),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
    done = (await gen.collect(ready, [request.generation], http))[0]
    agent_requests.hold_breakpoints(ready, request)
    answer = anthropic.message(ready, request, model, done.text, done.final, done.tokens)
    if done.final.finish_reason in choices.ANSWERED:
        continuations.messages(ready, body, answer["content"], salt)
    return answer


@router.post("/messages/count_tokens", responses=_errors(400, 404, 413, 499))
async def count_tokens(
    body: CountTokensRequest, http: Request, ready: ReadyDep, beta: bool | None = _BETA
) -> dict[str, int]:
    _check_model(ready, body.model)
    prompt = await agent_requests.render_agent_prompt(ready, body.chat(), body.options(), http)
    return {"input_tokens": len(prompt.tokens)}


def _check_model(ready: ReadyDep, name: str) -> None:
    if name not in ready.model_ids:
        raise APIError(404, f"model: {name} (this server serves {sorted(ready.model_ids)})")


async def _ending_on_error(stream: AsyncGenerator[bytes, None]) -> AsyncIterator[bytes]:
    """After the 200 an error can only be an `error` event."""
    try:
        async for chunk in stream:
            yield chunk
    except Exception as exc:
        log.exception("stream failed")
        yield anthropic.error_event(500, f"internal error: {type(exc).__name__}")
    finally:
        await stream.aclose()
