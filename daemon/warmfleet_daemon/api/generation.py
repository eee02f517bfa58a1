"""What every API's request path shares once its body is an engine request: the model
check, prompt building that stops when the client goes away, the choices of one request
(OpenAI `n`), running them to completion or as they come, their usage by cache tier,
and the keep-alive beat of a long prefill. The paths themselves: `chat_requests`
(OpenAI chat completions and completions) and `agent_requests` (Anthropic Messages,
OpenAI Responses)."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field, replace
from typing import Any

import anyio
from fastapi import Request
from starlette.concurrency import run_in_threadpool

from warmfleet_common.prompts import RenderedPrompt
from warmfleet_common.tenancy import cache_salt
from warmfleet_common.tiers import Tier
from warmfleet_daemon.api.channels import ChannelSplitter, writes_channels
from warmfleet_daemon.api.errors import APIError
from warmfleet_daemon.api.output import OutputSplitter, Splitter, starts_thinking, thinking_markers
from warmfleet_daemon.api.spill import current_peer
from warmfleet_daemon.api.tenants import current_tenant
from warmfleet_daemon.api.tool_calls import ToolCallParser, tool_format
from warmfleet_daemon.engine.processors import TokenLogprob
from warmfleet_daemon.engine.requests import Event, GenerationRequest, Usage
from warmfleet_daemon.runtime.assembly import Ready

_DISCONNECT_POLL_S = 0.5


def check_model(ready: Ready, name: str) -> None:
    if name not in ready.model_ids:
        raise APIError(
            404, f"The model `{name}` does not exist.", param="model", code="model_not_found"
        )


async def while_connected(
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


def salted(prompt: RenderedPrompt, request_salt: str | None) -> RenderedPrompt:
    """`prompt` keyed in its tenant's namespace (and its own `cache_salt`'s)."""
    return replace(prompt, salt=cache_salt(current_tenant(), request_salt))


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


def created() -> int:
    return int(time.time())


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
            # `events` is inside that `anext` until the task ends: closing it before then
            # (the client went away) would raise "asynchronous generator is already running".
            pending.cancel()
            with anyio.CancelScope(shield=True):  # the request's scope is being cancelled
                await asyncio.wait({pending})
            if not pending.cancelled():
                pending.exception()  # retrieved: it failed as the stream ended


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
