"""OpenAI's Responses API (Codex), stateless: `POST /v1/responses`. Errors in OpenAI's
shape; `store: true` and `previous_response_id` are refused (nothing is stored)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from warmfleet_common.agent_apis.responses import ResponsesRequest
from warmfleet_daemon.api import agent_requests, choices, continuations, responses
from warmfleet_daemon.api import generation as gen
from warmfleet_daemon.api.deps import ReadyDep, StateDep
from warmfleet_daemon.api.openapi import errors

router = APIRouter(prefix="/v1", responses=errors(503))


@router.post(
    "/responses",
    responses={
        200: {"content": {"text/event-stream": {"schema": {"type": "string"}}}},
        **errors(400, 404, 413, 499),
    },
)
async def create_response(
    body: ResponsesRequest, http: Request, ready: ReadyDep, state: StateDep
) -> Any:
    gen.check_model(ready, body.model)
    request = await agent_requests.agent_request(
        ready,
        body.chat(),
        body.options(),
        http,
        state.settings,
        max_tokens=body.max_output_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        user=body.user or body.safety_identifier or body.prompt_cache_key,
        cache_salt=body.cache_salt,
    )
    salt = request.prompt.salt
    model = state.served_name()
    headers = (
        {"x-warmfleet-tools-left-out": ",".join(body.hosted_tools())} if body.hosted_tools() else {}
    )
    if body.stream:
        return StreamingResponse(
            responses.stream(
                ready,
                body,
                request,
                model,
                lambda output: continuations.responses(ready, body, output, salt),
            ),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **headers},
        )
    done = (await gen.collect(ready, [request.generation], http))[0]
    answer = responses.response(ready, body, request, model, done.text, done.final)
    if done.final.finish_reason in choices.ANSWERED:
        continuations.responses(ready, body, answer["output"], salt)
    return JSONResponse(answer, headers=headers)
