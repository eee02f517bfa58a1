"""From an OpenAI request body to engine events and back: validation, prompt building,
non-streaming collection and SSE streaming."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field, replace
from typing import Any

from fastapi import Request
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from warmfleet_common.agent_apis.chat import TOOLS, TTL_SECONDS, ChatOptions, ChatPrompt
from warmfleet_common.contract import ToolDefinition
from warmfleet_common.prompts import PromptError, PromptTooLong, RenderedPrompt
from warmfleet_common.tiers import Tier
from warmfleet_daemon.api.channels import ChannelSplitter, writes_channels
from warmfleet_daemon.api.constraints import output_constraints
from warmfleet_daemon.api.errors import APIError, error_body
from warmfleet_daemon.api.output import (
    OutputSplitter,
    Splitter,
    ThinkingMarkers,
    starts_thinking,
    thinking_markers,
)
from warmfleet_daemon.api.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    JsonSchemaFormat,
    NamedToolChoice,
    PromptTokensDetails,
    ResponseFormat,
    UsageInfo,
)
from warmfleet_daemon.api.spill import current_peer
from warmfleet_daemon.api.tool_calls import ToolCallParser, tool_format
from warmfleet_daemon.engine.processors import TokenLogprob
from warmfleet_daemon.engine.requests import Event, GenerationRequest, Usage
from warmfleet_daemon.engine.sampling import SamplingParams
from warmfleet_daemon.runtime.assembly import Ready
from warmfleet_daemon.settings import DaemonSettings

log = logging.getLogger(__name__)

_DISCONNECT_POLL_S = 0.5
_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def check_model(ready: Ready, name: str) -> None:
    if name not in ready.model_ids:
        raise APIError(
            404, f"The model `{name}` does not exist.", param="model", code="model_not_found"
        )


async def chat_request(
    ready: Ready,
    body: ChatCompletionRequest,
    settings: DaemonSettings,
    http: Request | None = None,
) -> GenerationRequest:
    check_model(ready, body.model)
    messages = [m.as_template_message() for m in body.messages]
    tools = [t.model_dump(exclude_none=True) for t in body.tools] if body.tools else None
    context = ready.model.context_length
    grammar, stops = await run_in_threadpool(output_constraints, ready, body)
    try:
        prompt = await _while_connected(
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
    return _request(
        ready, prompt, body, max_tokens, settings, "messages", "chat", grammar=grammar, stops=stops
    )


async def _while_connected(
    http: Request | None, build: Callable[..., RenderedPrompt], *args: Any, **kwargs: Any
) -> RenderedPrompt:
    """`build(*args, cancelled=..., **kwargs)` in the thread pool; if the client goes
    away meanwhile, `cancelled()` turns true (so the work stops) and this answers 499."""
    gone = threading.Event()
    task = asyncio.ensure_future(run_in_threadpool(build, *args, cancelled=gone.is_set, **kwargs))
    task.add_done_callback(lambda t: t.cancelled() or t.exception())  # retrieved
    while True:
        done, _ = await asyncio.wait({task}, timeout=_DISCONNECT_POLL_S)
        if done:
            return task.result()
        if http is not None and await http.is_disconnected():
            gone.set()
            raise APIError(499, "client closed the request", code="client_closed")


async def completion_request(
    ready: Ready, body: CompletionRequest, settings: DaemonSettings
) -> GenerationRequest:
    check_model(ready, body.model)
    try:
        text_or_ids = body.single_prompt()
        prompt = await run_in_threadpool(ready.prompts.completion, text_or_ids)
    except (PromptError, ValueError) as exc:
        raise APIError(400, str(exc), param="prompt") from exc
    vocab = len(ready.model.tokenizer)
    if any(not 0 <= t < vocab for t in prompt.tokens):
        raise APIError(400, f"prompt token ids must be in [0, {vocab})", param="prompt")
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
    if max_tokens is not None and n + max_tokens > context:
        raise APIError(
            400,
            f"This model's maximum context length is {context} tokens. However, you requested "
            f"{n + max_tokens} tokens ({n} in the {param}, {max_tokens} in the completion).",
            param="max_tokens",
            code="context_length_exceeded",
        )
    sampling = SamplingParams(
        max_tokens=max_tokens or min(settings.default_max_tokens, ceiling or context, context - n),
        temperature=settings.default_temperature if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        seed=body.seed,
        stop=body.stop_list() + stops,
        ignore_eos=body.ignore_eos,
        **_processing(ready, body),
        grammar=grammar,
    )
    return GenerationRequest(prompt, sampling, operation=operation, user=body.user)


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


def copies(request: GenerationRequest, n: int) -> list[GenerationRequest]:
    """`n` choices of one prompt. They share its cache: the engine prefills a chunk once
    and the others find it stored. A seeded request seeds choice i with seed + i. As one
    group, they hold at most the engine's per-request share of the sequence slots."""
    if n == 1:
        return [request]
    out = [replace(request, group=request.request_id)]
    seed = request.sampling.seed
    for i in range(1, n):
        sampling = replace(request.sampling, seed=None if seed is None else seed + i)
        out.append(replace(out[0], sampling=sampling, request_id=uuid.uuid4().hex))
    return out


def usage_info(usage: Usage | None) -> UsageInfo:
    u = usage or Usage(0, 0)
    return UsageInfo(
        prompt_tokens=u.prompt_tokens,
        completion_tokens=u.completion_tokens,
        total_tokens=u.prompt_tokens + u.completion_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=u.cached_tokens),
        cached_tokens_by_tier=tiers_of(u),
    )


def tiers_of(usage: Usage) -> dict[Tier, int]:
    """`usage.cached_tokens_by_tier` (every API's usage carries it: the router counts
    served hits by tier from it)."""
    return usage.cached.as_dict()


@dataclass
class Collected:
    """One choice, run to completion."""

    text: str = ""
    final: Event = field(default_factory=lambda: Event(""))
    logprobs: list[TokenLogprob] = field(default_factory=list)
    tokens: list[int] = field(
        default_factory=list
    )  # generated token ids, as the events carried them


async def choice_events(
    ready: Ready, requests: Sequence[GenerationRequest]
) -> AsyncGenerator[tuple[int, Event], None]:
    """The events of every choice, as they come, tagged with the choice's index.
    Closing the iterator early cancels the requests still running."""
    queue: asyncio.Queue[tuple[int, Event]] = asyncio.Queue()

    # The router's spill: copy the blocks this daemon lacks from it (with its grant).
    peer, grant = current_peer() or (None, None)

    async def pump(index: int, request: GenerationRequest) -> None:
        if peer is not None and request.peer is None:
            request = replace(request, peer=peer, peer_grant=grant)
        try:
            async for event in ready.engine.generate(request):
                queue.put_nowait((index, event))
        except Exception as exc:  # e.g. a refused submit: this choice fails, visibly
            queue.put_nowait((index, Event("", finish_reason="error", error=str(exc))))

    tasks = [asyncio.create_task(pump(i, r)) for i, r in enumerate(requests)]
    try:
        running = len(tasks)
        while running:
            index, event = await queue.get()
            running -= event.finish_reason is not None
            yield index, event
    finally:
        for task in tasks:
            task.cancel()


async def collect(
    ready: Ready, requests: Sequence[GenerationRequest], http: Request
) -> list[Collected]:
    """Run every choice to completion; give up (and free the batch slots) if the client
    goes away."""
    out = [Collected() for _ in requests]

    async def consume() -> None:
        async with aclosing(choice_events(ready, requests)) as events:
            async for index, event in events:
                out[index].text += event.text
                out[index].logprobs.extend(event.logprobs)
                out[index].tokens.extend(event.token_ids)
                out[index].final = event

    task = asyncio.create_task(consume())
    while True:
        done, _ = await asyncio.wait({task}, timeout=_DISCONNECT_POLL_S)
        if done:
            break
        if await http.is_disconnected():
            task.cancel()
            raise APIError(499, "client closed the request", code="client_closed")
    task.result()
    for choice in out:
        if choice.final.finish_reason == "error":
            raise APIError(500, f"generation failed: {choice.final.error}", type_="server_error")
    return out


def total_usage(finals: Sequence[Event]) -> Usage:
    """The prompt counted once (choices share it), completions added up; cached tokens
    as the first choice found them."""
    usages = [e.usage for e in finals if e.usage is not None]
    if not usages:
        return Usage(0, 0)
    return Usage(
        usages[0].prompt_tokens, sum(u.completion_tokens for u in usages), usages[0].cached
    )


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def streaming_response(
    ready: Ready,
    requests: Sequence[GenerationRequest],
    *,
    base: dict[str, Any],
    choice: Callable[[int], Callable[[Event], list[dict[str, Any]]]],
    first: Callable[[int], dict[str, Any]] | None,
    include_usage: bool,
) -> StreamingResponse:
    """OpenAI server-sent events: `base` fields on every chunk; `choice(i)` turns choice
    i's events into its chunks' choice objects (`first(i)`: an opening one, e.g. the
    assistant role); the usage chunk last when asked. Closing the stream (client gone)
    cancels the requests."""

    async def events() -> AsyncGenerator[bytes, None]:
        if first is not None:
            for i in range(len(requests)):
                yield _data({**base, "choices": [first(i)]}, include_usage)
        renderers = [choice(i) for i in range(len(requests))]
        finals: dict[int, Event] = {}
        failed = False
        async with aclosing(choice_events(ready, requests)) as stream:
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
        if include_usage and not failed:
            usage = usage_info(total_usage([finals[i] for i in sorted(finals)])).model_dump()
            yield _data({**base, "choices": [], "usage": usage}, False)
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


def created() -> int:
    return int(time.time())


# -- the agent APIs (Anthropic Messages, OpenAI Responses) ------------------------------


@dataclass(frozen=True)
class AgentRequest:
    """An agent API request, ready for the engine: its prompt as rendered, where its
    cache breakpoints fall (token position, TTL), and how to read its output."""

    generation: GenerationRequest
    prompt: RenderedPrompt
    chat: ChatPrompt
    options: ChatOptions
    breakpoints: tuple[tuple[int, str], ...]
    markers: ThinkingMarkers | None
    client_stops: tuple[str, ...] = ()  # the client's own stop sequences

    def splitter(self, ready: Ready) -> Splitter:
        parse = bool(self.chat.tools) and self.options.tool_choice != "none"
        return output_splitter(
            ready.model.tokenizer, self.chat.tools if parse else None, self.prompt.text
        )


def output_splitter(
    tokenizer: Any, tools: list[dict[str, Any]] | None, prompt_text: str | None
) -> Splitter:
    """How this model's output is read: harmony channels, or its thinking markers and
    its family's tool-call format. `tools` None: calls are not parsed (tool_choice none)."""
    if writes_channels(tokenizer):
        return ChannelSplitter(parse_calls=tools is not None)
    markers = thinking_markers(tokenizer)
    parser = ToolCallParser(tool_format(tokenizer), tools) if tools is not None else None
    return OutputSplitter(markers, parser, thinking_first=starts_thinking(markers, prompt_text))


async def render_agent_prompt(
    ready: Ready, chat: ChatPrompt, options: ChatOptions, http: Request | None
) -> RenderedPrompt:
    """The prompt as the engine sees it; a 400 when it does not fit the context."""
    context = ready.model.context_length
    try:
        return await _while_connected(
            http,
            ready.prompts.chat,
            chat.messages,
            chat.tools,
            max_tokens=context,
            template_kwargs=chat.template_kwargs(options),
        )
    except PromptTooLong as exc:
        raise APIError(
            400,
            f"prompt is too long: {exc.tokens} tokens > {context - 1} maximum (the model's "
            f"context is {context} tokens)",
            param="messages",
            code="context_length_exceeded",
        ) from exc
    except PromptError as exc:
        raise APIError(400, str(exc), param="messages") from exc


async def agent_request(
    ready: Ready,
    chat: ChatPrompt,
    options: ChatOptions,
    http: Request | None,
    settings: DaemonSettings,
    *,
    max_tokens: int | None,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    stop: tuple[str, ...] = (),
    user: str | None = None,
    operation: str = "chat",
) -> AgentRequest:
    """Render and check an agent request. `max_tokens` beyond what the context leaves
    (or --max-output-tokens) is served up to that (None: up to it); 0 only prefills the
    prompt (its blocks are stored, nothing is generated)."""
    grammar, stops = await run_in_threadpool(
        output_constraints, ready, _constraint_view(chat, options)
    )
    prompt = await render_agent_prompt(ready, chat, options, http)
    room = ready.model.context_length - len(prompt.tokens)
    if settings.max_output_tokens is not None:
        room = min(room, settings.max_output_tokens)
    sampling = SamplingParams(
        max_tokens=max(1, room if max_tokens is None else min(max_tokens, room)),
        temperature=settings.default_temperature if temperature is None else temperature,
        top_p=1.0 if top_p is None else top_p,
        top_k=top_k or 0,
        stop=stop + stops,
        grammar=grammar,
    )
    generation = GenerationRequest(
        prompt,
        sampling,
        operation=operation,
        user=user,
        prefill_only=max_tokens == 0,
    )
    return AgentRequest(
        generation,
        prompt,
        chat,
        options,
        breakpoint_positions(chat, prompt),
        thinking_markers(ready.model.tokenizer),
        stop,
    )


def _constraint_view(chat: ChatPrompt, options: ChatOptions) -> ChatCompletionRequest:
    """The chat-completions body whose constraints (forced tool calls, JSON output)
    this request has: one grammar path for every API."""
    tools = [ToolDefinition.model_validate(t) for t in chat.tools] if chat.tools else None
    choice: Any = options.tool_choice
    if isinstance(choice, dict):
        choice = NamedToolChoice.model_validate(choice)
    response_format = None
    if options.json_schema is not None:
        response_format = ResponseFormat(
            type="json_schema", json_schema=JsonSchemaFormat(schema=options.json_schema)
        )
    elif options.json_object:
        response_format = ResponseFormat(type="json_object")
    return ChatCompletionRequest.model_construct(
        model="",
        messages=[],
        tools=tools,
        tool_choice=choice if tools else None,
        parallel_tool_calls=options.parallel_tool_calls,
        response_format=response_format,
        ignore_eos=False,
    )


def breakpoint_positions(chat: ChatPrompt, prompt: RenderedPrompt) -> tuple[tuple[int, str], ...]:
    """Where each cache breakpoint ends, in tokens: the cut where the next message's
    content starts (a prefix every request that goes on from there shares); in the last
    message, where the reply's content starts (what the next turn shares). Breakpoints
    with no cut to end at are left out (their prefix is cached as usual, not pinned)."""
    n, starts, count = len(prompt.tokens), prompt.message_starts, len(chat.messages)
    out: dict[int, str] = {}
    for mark in chat.breakpoints:
        if mark.message == TOOLS:
            following = next(
                (i for i, m in enumerate(chat.messages) if m.get("role") != "system"), count
            )
        else:
            following = mark.message + 1
        if following >= count:
            position = prompt.reply_start or n
        else:
            position = starts[following] if following < len(starts) else 0
        if position:
            # The longer TTL wins where two breakpoints end at one place.
            out[position] = "1h" if "1h" in (mark.ttl, out.get(position)) else mark.ttl
    return tuple(sorted(out.items()))


def cache_creation(breakpoints: Sequence[tuple[int, str]], cached: int) -> dict[str, int]:
    """Prompt tokens the breakpoints newly stored (those before the last breakpoint
    that were not read from the cache), by TTL."""
    created = {"5m": 0, "1h": 0}
    previous = 0
    for position, ttl in breakpoints:
        created[ttl] += max(0, position - max(previous, cached))
        previous = max(previous, position)
    return created


def hold_breakpoints(ready: Ready, request: AgentRequest) -> None:
    """Pin each breakpoint's prefix for its TTL (within the pin budget): after the
    prompt was prefilled, its blocks are in the cache."""
    if ready.pins is None or not request.breakpoints:
        return
    chunks = ready.engine.plan(request.prompt)
    for position, ttl in request.breakpoints:
        keys = [c.key for c in chunks if c.end <= position]
        ready.pins.hold(keys, TTL_SECONDS[ttl])


def stop_reason_of(
    final: Event, generated: Sequence[int], stops: Sequence[str], ready: Ready, calls: int
) -> tuple[str, str | None]:
    """Why the response ended, in Anthropic's terms (and which stop sequence)."""
    reason = final.finish_reason
    if reason in ("length", "prefilled"):
        return "max_tokens", None
    if calls:
        return "tool_use", None
    eos = set(ready.model.tokenizer.eos_token_ids)
    if reason == "stop" and stops and (not generated or generated[-1] not in eos):
        text = ready.prompts.decode(generated)
        found = [(text.find(s), s) for s in stops if s in text]
        return "stop_sequence", min(found)[1] if found else stops[0]
    return "end_turn", None


async def heartbeat(
    events: AsyncIterator[tuple[int, Event]], every_s: float
) -> AsyncGenerator[tuple[int, Event] | None, None]:
    """`events`, with a None whenever `every_s` seconds pass without one (a long
    prefill): the caller sends its API's keep-alive then."""
    pending: asyncio.Future[tuple[int, Event]] | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(anext(events))
            done, _ = await asyncio.wait({pending}, timeout=every_s)
            if not done:
                yield None
                continue
            try:
                item = pending.result()
            except StopAsyncIteration:
                return
            finally:
                pending = None
            yield item
    finally:
        if pending is not None:
            pending.cancel()
