"""OpenAI-compatible routes: /v1/chat/completions, /v1/completions, /v1/models."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from warmfleet_daemon.api import generation as gen
from warmfleet_daemon.api.deps import ReadyDep, StateDep
from warmfleet_daemon.api.openapi import errors
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
)

router = APIRouter(prefix="/v1", responses=errors(503))
# A generation route: JSON, or server-sent events with `stream: true`.
_GENERATION = {
    200: {"content": {"text/event-stream": {"schema": {"type": "string"}}}},
    **errors(400, 404, 413, 499),
}


@router.post("/chat/completions", response_model=ChatCompletion, responses=_GENERATION)
async def chat_completions(
    body: ChatCompletionRequest, http: Request, ready: ReadyDep, state: StateDep
) -> Any:
    request = await gen.chat_request(ready, body, state.settings, http)
    rid, created, model = gen.new_id("chatcmpl"), gen.created(), state.served_name()
    if body.stream:
        return gen.streaming_response(
            ready,
            request,
            base={"id": rid, "object": "chat.completion.chunk", "created": created, "model": model},
            choice=lambda text, finish: {
                "index": 0,
                "delta": {"content": text} if text else {},
                "finish_reason": finish,
                "logprobs": None,
            },
            first={
                "index": 0,
                "delta": {"role": "assistant", "content": ""},
                "finish_reason": None,
                "logprobs": None,
            },
            include_usage=bool(body.stream_options and body.stream_options.include_usage),
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


@router.post("/completions", response_model=Completion, responses=_GENERATION)
async def completions(
    body: CompletionRequest, http: Request, ready: ReadyDep, state: StateDep
) -> Any:
    request = await gen.completion_request(ready, body, state.settings)
    rid, created, model = gen.new_id("cmpl"), gen.created(), state.served_name()
    if body.stream:
        return gen.streaming_response(
            ready,
            request,
            base={"id": rid, "object": "text_completion", "created": created, "model": model},
            choice=lambda text, finish: {
                "index": 0,
                "text": text,
                "finish_reason": finish,
                "logprobs": None,
            },
            first=None,
            include_usage=bool(body.stream_options and body.stream_options.include_usage),
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
