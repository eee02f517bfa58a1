"""The OpenAI request path: a chat completions or completions body into an engine
request (its prompt, sampling, output constraints and limits, each refused with a 400
naming the parameter when it cannot be honoured), and the usage and server-sent events
OpenAI clients read."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from contextlib import aclosing
from typing import Any

from fastapi import Request
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from warmfleet_common.agent_apis.chat import ChatOptions
from warmfleet_common.prompts import PromptError, PromptTooLong, RenderedPrompt
from warmfleet_common.wire import STREAM_USAGE_COMMENT
from warmfleet_daemon.api import generation as gen
from warmfleet_daemon.api.constraints import OutputRules, output_constraints
from warmfleet_daemon.api.errors import APIError, error_body
from warmfleet_daemon.api.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    PromptTokensDetails,
    UsageInfo,
)
from warmfleet_daemon.api.tenants import current_tenant
from warmfleet_daemon.engine.requests import Event, GenerationRequest, Usage
from warmfleet_daemon.engine.sampling import SamplingParams
from warmfleet_daemon.runtime.assembly import Ready
from warmfleet_daemon.settings import DaemonSettings

log = logging.getLogger(__name__)

_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def output_rules(body: ChatCompletionRequest) -> OutputRules:
    """What a chat completions body asks of its output, as every API's path says it."""
    choice = body.tool_choice
    fmt = body.response_format
    schema = None
    if fmt is not None and fmt.type == "json_schema" and fmt.json_schema is not None:
        schema = fmt.json_schema.schema_
    options = ChatOptions(
        tool_choice=choice.model_dump()
        if choice is not None and not isinstance(choice, str)
        else choice,
        parallel_tool_calls=body.parallel_tool_calls,
        json_schema=schema,
        json_object=fmt is not None and fmt.type == "json_object",
    )
    tools = [t.model_dump(exclude_none=True) for t in body.tools] if body.tools else None
    return OutputRules(tools, options, ignore_eos=body.ignore_eos)


async def chat_request(
    ready: Ready,
    body: ChatCompletionRequest,
    settings: DaemonSettings,
    http: Request | None = None,
) -> GenerationRequest:
    gen.check_model(ready, body.model)
    messages = [m.as_template_message() for m in body.messages]
    tools = [t.model_dump(exclude_none=True) for t in body.tools] if body.tools else None
    context = ready.model.context_length
    grammar, stops = await run_in_threadpool(output_constraints, ready, output_rules(body))
    try:
        prompt = await gen.while_connected(
            http, ready.prompts.chat, messages, tools, max_tokens=context
        )
    except PromptTooLong as exc:
        raise APIError(
            400,
            f"This model's maximum context length is {context} tokens. However, your "
            f"messages resulted in {exc.tokens} tokens.",
            param="messages",
            code="context_length_exceeded",
        ) from exc
    except PromptError as exc:
        raise APIError(400, str(exc), param="messages") from exc
    max_tokens = body.max_completion_tokens or body.max_tokens
    prompt = gen.salted(prompt, body.cache_salt)
    return _request(
        ready, prompt, body, max_tokens, settings, "messages", "chat", grammar=grammar, stops=stops
    )


async def completion_request(
    ready: Ready, body: CompletionRequest, settings: DaemonSettings
) -> GenerationRequest:
    gen.check_model(ready, body.model)
    try:
        text_or_ids = body.single_prompt()
        prompt = await run_in_threadpool(ready.prompts.completion, text_or_ids)
    except (PromptError, ValueError) as exc:
        raise APIError(400, str(exc), param="prompt") from exc
    vocab = len(ready.model.tokenizer)
    if any(not 0 <= t < vocab for t in prompt.tokens):
        raise APIError(400, f"prompt token ids must be in [0, {vocab})", param="prompt")
    prompt = gen.salted(prompt, body.cache_salt)
    return _request(ready, prompt, body, body.max_tokens, settings, "prompt", "text_completion")


def _request(
    ready: Ready,
    prompt: RenderedPrompt,
    body: ChatCompletionRequest | CompletionRequest,
    max_tokens: int | None,
    settings: DaemonSettings,
    param: str,
    operation: str,
    *,
    grammar: str | None = None,
    stops: tuple[str, ...] = (),
) -> GenerationRequest:
    context = ready.model.context_length
    n = len(prompt.tokens)
    ceiling = settings.max_output_tokens
    if ceiling is not None and max_tokens is not None:
        max_tokens = min(max_tokens, ceiling)
    if n >= context:
        raise APIError(
            400,
            f"This model's maximum context length is {context} tokens. However, your "
            f"{param} resulted in {n} tokens.",
            param=param,
            code="context_length_exceeded",
        )
    # More than the context leaves (opencode asks for 32,000 whatever the model): the
    # answer runs to the context's end and finishes with "length", as on Anthropic's route.
    room = context - n
    sampling = SamplingParams(
        max_tokens=min(max_tokens, room)
        if max_tokens is not None
        else min(settings.default_max_tokens, ceiling or context, room),
        temperature=settings.default_temperature if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        seed=body.seed,
        stop=body.stop_list() + stops,
        ignore_eos=body.ignore_eos,
        **_processing(ready, body),
        grammar=grammar,
    )
    return GenerationRequest(
        prompt, sampling, operation=operation, user=body.user, tenant=current_tenant()
    )


def _processing(ready: Ready, body: ChatCompletionRequest | CompletionRequest) -> dict[str, Any]:
    """SamplingParams for logit bias, penalties and logprobs."""
    vocab = len(ready.model.tokenizer)
    bias = tuple((int(t), float(b)) for t, b in (body.logit_bias or {}).items())
    if any(t >= vocab for t, _ in bias):
        raise APIError(400, f"logit_bias token ids must be in [0, {vocab})", param="logit_bias")
    if isinstance(body, ChatCompletionRequest):
        logprobs = (body.top_logprobs or 0) if body.logprobs else None
    else:
        logprobs = body.logprobs
    return {
        "logit_bias": bias,
        "presence_penalty": body.presence_penalty or 0.0,
        "frequency_penalty": body.frequency_penalty or 0.0,
        "repetition_penalty": body.repetition_penalty or 1.0,
        "logprobs": logprobs,
    }


def usage_info(usage: Usage | None) -> UsageInfo:
    u = usage or Usage(0, 0)
    return UsageInfo(
        prompt_tokens=u.prompt_tokens,
        completion_tokens=u.completion_tokens,
        total_tokens=u.prompt_tokens + u.completion_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=u.cached_tokens),
        cached_tokens_by_tier=gen.tiers_of(u),
    )


def streaming_response(
    ready: Ready,
    requests: Sequence[GenerationRequest],
    *,
    base: dict[str, Any],
    choice: Callable[[int], Callable[[Event], list[dict[str, Any]]]],
    first: Callable[[int], dict[str, Any]] | None,
    include_usage: bool,
    usage_comment: bool = False,
) -> StreamingResponse:
    """OpenAI server-sent events: `base` fields on every chunk; `choice(i)` turns choice
    i's events into its chunks' choice objects (`first(i)`: an opening one, e.g. the
    assistant role); the usage chunk last when asked, else, for the router
    (`usage_comment`), the usage as an SSE comment. Closing the stream (client gone)
    cancels the requests."""

    async def events() -> AsyncGenerator[bytes, None]:
        if first is not None:
            for i in range(len(requests)):
                yield _data({**base, "choices": [first(i)]}, include_usage)
        renderers = [choice(i) for i in range(len(requests))]
        finals: dict[int, Event] = {}
        failed = False
        async with aclosing(gen.choice_events(ready, requests)) as stream:
            async for index, event in stream:
                if event.finish_reason == "error":
                    error = error_body(f"generation failed: {event.error}", "server_error")
                    yield _data(error, False)
                    failed = True
                    break
                for rendered in renderers[index](event):
                    yield _data({**base, "choices": [rendered]}, include_usage)
                if event.finish_reason is not None:
                    finals[index] = event
        if (include_usage or usage_comment) and not failed:
            usage = usage_info(gen.total_usage([finals[i] for i in sorted(finals)])).model_dump()
            if include_usage:
                yield _data({**base, "choices": [], "usage": usage}, False)
            else:
                comment = json.dumps({"usage": usage}, separators=(",", ":")).encode()
                yield STREAM_USAGE_COMMENT + comment + b"\n\n"
        yield b"data: [DONE]\n\n"

    return StreamingResponse(
        _ending_on_error(events()), media_type="text/event-stream", headers=_SSE_HEADERS
    )


async def _ending_on_error(stream: AsyncGenerator[bytes, None]) -> AsyncIterator[bytes]:
    """Once the 200 is sent, an error can only be said in the stream: an error event,
    then [DONE], so clients see an end rather than a cut connection."""
    try:
        async for chunk in stream:
            yield chunk
    except Exception as exc:
        log.exception("stream failed")
        yield _data(error_body(f"internal error: {type(exc).__name__}", "server_error"), False)
        yield b"data: [DONE]\n\n"
    finally:
        await stream.aclose()  # at once when the client goes: it cancels the request


def _data(payload: dict[str, Any], include_usage: bool) -> bytes:
    if include_usage and "usage" not in payload:
        payload = {**payload, "usage": None}
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()
