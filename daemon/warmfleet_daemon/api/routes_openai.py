"""OpenAI-compatible routes: /v1/chat/completions, /v1/completions, /v1/models."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from warmfleet_daemon.api import generation as gen
from warmfleet_daemon.api.deps import ReadyDep, StateDep
from warmfleet_daemon.api.errors import ErrorResponse
from warmfleet_daemon.api.schemas import (
    AssistantMessage,
    ChatChoice,
    ChatCompletion,
    ChatCompletionRequest,
    Completion,
    CompletionChoice,
    CompletionRequest,
    ModelCard,
    ModelList,
    UsageInfo,
)

router = APIRouter(
    prefix="/v1", responses={400: {"model": ErrorResponse}, 503: {"model": ErrorResponse}}
)

_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


@router.post("/chat/completions", response_model=ChatCompletion)
async def chat_completions(
    body: ChatCompletionRequest, http: Request, ready: ReadyDep, state: StateDep
) -> Any:
    request = await gen.chat_request(ready, body, state.settings)
    rid, created, model = gen.new_id("chatcmpl"), gen.created(), state.served_name()
    if body.stream:
        base = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model}

        def chunk(text: str, finish: str | None) -> dict[str, Any]:
            delta = {"content": text} if text else {}
            return {
                **base,
                "choices": [
                    {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
                ],
            }

        def usage_chunk(usage: UsageInfo) -> dict[str, Any]:
            return {**base, "choices": [], "usage": usage.model_dump()}

        first = {
            **base,
            "choices": [
                {
                    "index": 0,
                    "delta": {"role": "assistant", "content": ""},
                    "finish_reason": None,
                    "logprobs": None,
                }
            ],
        }
        include = bool(body.stream_options and body.stream_options.include_usage)
        return StreamingResponse(
            gen.sse(
                ready,
                request,
                first=first,
                chunk=chunk,
                include_usage=include,
                usage_chunk=usage_chunk,
            ),
            media_type="text/event-stream",
            headers=_SSE_HEADERS,
        )
    text, final = await gen.collect(ready, request, http)
    return ChatCompletion(
        id=rid,
        created=created,
        model=model,
        choices=[
            ChatChoice(message=AssistantMessage(content=text), finish_reason=final.finish_reason)
        ],
        usage=gen.usage_info(final.usage),
    )


@router.post("/completions", response_model=Completion)
async def completions(
    body: CompletionRequest, http: Request, ready: ReadyDep, state: StateDep
) -> Any:
    request = await gen.completion_request(ready, body, state.settings)
    rid, created, model = gen.new_id("cmpl"), gen.created(), state.served_name()
    if body.stream:
        base = {"id": rid, "object": "text_completion", "created": created, "model": model}

        def chunk(text: str, finish: str | None) -> dict[str, Any]:
            return {
                **base,
                "choices": [{"index": 0, "text": text, "finish_reason": finish, "logprobs": None}],
            }

        def usage_chunk(usage: UsageInfo) -> dict[str, Any]:
            return {**base, "choices": [], "usage": usage.model_dump()}

        include = bool(body.stream_options and body.stream_options.include_usage)
        return StreamingResponse(
            gen.sse(
                ready,
                request,
                first=None,
                chunk=chunk,
                include_usage=include,
                usage_chunk=usage_chunk,
            ),
            media_type="text/event-stream",
            headers=_SSE_HEADERS,
        )
    text, final = await gen.collect(ready, request, http)
    return Completion(
        id=rid,
        created=created,
        model=model,
        choices=[CompletionChoice(text=text, finish_reason=final.finish_reason)],
        usage=gen.usage_info(final.usage),
    )


@router.get("/models", response_model=ModelList)
async def models(ready: ReadyDep, state: StateDep) -> ModelList:
    return ModelList(
        data=[
            ModelCard(
                id=state.served_name(),
                created=int(state.started_at),
                max_model_len=ready.model.context_length,
            )
        ]
    )
