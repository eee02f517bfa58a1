"""OpenAI-compatible routes: /v1/chat/completions, /v1/completions, /v1/models."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from warmfleet_common.wire import STREAM_USAGE_HEADER
from warmfleet_daemon.api import chat_requests, choices, continuations
from warmfleet_daemon.api import generation as gen
from warmfleet_daemon.api.deps import ReadyDep, StateDep
from warmfleet_daemon.api.openapi import errors
from warmfleet_daemon.api.output import Splitter
from warmfleet_daemon.api.schemas import (
    ChatCompletion,
    ChatCompletionRequest,
    Completion,
    CompletionRequest,
    ModelCard,
    ModelList,
)
from warmfleet_daemon.engine.requests import Event

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
    request = await chat_requests.chat_request(ready, body, state.settings, http)
    requests = gen.copies(request, body.n)
    rid, created, model = gen.new_id("chatcmpl"), gen.created(), state.served_name()
    token_bytes = await _token_bytes(ready, bool(body.logprobs))
    tools = [t.model_dump(exclude_none=True) for t in body.tools or []]
    parsed = tools if chat_requests.output_rules(body).tool_choice != "none" else None

    def parser() -> Splitter:
        return gen.output_splitter(ready.model.tokenizer, parsed, request.prompt.text)

    def deltas(i: int) -> choices.Renderer:
        render = choices.chat_deltas(i, parser(), token_bytes)
        if i:
            return render
        answer = continuations.ChatAnswer()

        def rendered(event: Event) -> list[dict[str, Any]]:
            out = render(event)
            answer.add(out)
            if event.finish_reason in choices.ANSWERED:
                continuations.chat(ready, body, answer.message(), request.prompt.salt)
            return out

        return rendered

    if body.stream:
        return chat_requests.streaming_response(
            ready,
            requests,
            base={"id": rid, "object": "chat.completion.chunk", "created": created, "model": model},
            choice=deltas,
            first=lambda i: {
                "index": i,
                "delta": {"role": "assistant", "content": ""},
                "finish_reason": None,
                "logprobs": None,
            },
            include_usage=bool(body.stream_options and body.stream_options.include_usage),
            usage_comment=STREAM_USAGE_HEADER in http.headers,
        )
    done = await gen.collect(ready, requests, http)
    completion = ChatCompletion(
        id=rid,
        created=created,
        model=model,
        choices=[choices.chat_choice(i, c, parser(), token_bytes) for i, c in enumerate(done)],
        usage=chat_requests.usage_info(gen.total_usage([c.final for c in done])),
    )
    if done[0].final.finish_reason in choices.ANSWERED:
        continuations.chat(
            ready, body, completion.choices[0].message.model_dump(), request.prompt.salt
        )
    return completion


@router.post("/completions", response_model=Completion, responses=_GENERATION)
async def completions(
    body: CompletionRequest, http: Request, ready: ReadyDep, state: StateDep
) -> Any:
    request = await chat_requests.completion_request(ready, body, state.settings)
    requests = gen.copies(request, body.n)
    rid, created, model = gen.new_id("cmpl"), gen.created(), state.served_name()
    token_bytes = await _token_bytes(ready, body.logprobs is not None)
    if body.stream:
        return chat_requests.streaming_response(
            ready,
            requests,
            base={"id": rid, "object": "text_completion", "created": created, "model": model},
            choice=lambda i: choices.completion_deltas(i, token_bytes),
            first=None,
            include_usage=bool(body.stream_options and body.stream_options.include_usage),
            usage_comment=STREAM_USAGE_HEADER in http.headers,
        )
    done = await gen.collect(ready, requests, http)
    return Completion(
        id=rid,
        created=created,
        model=model,
        choices=[choices.completion_choice(i, c, token_bytes) for i, c in enumerate(done)],
        usage=chat_requests.usage_info(gen.total_usage([c.final for c in done])),
    )


async def _token_bytes(ready: ReadyDep, wanted: bool) -> choices.TokenBytes | None:
    """Token id -> its exact bytes, for logprobs (the tokenizer view is built once)."""
    if not wanted:
        return None
    grammars = ready.engine.grammars
    await run_in_threadpool(lambda: grammars.ll_tokenizer)
    return grammars.token_bytes


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
