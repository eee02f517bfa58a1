"""The agent APIs' request path (Anthropic Messages, OpenAI Responses): a request already
translated to the chat template's messages and tools (`warmfleet_common.agent_apis`)
into an engine request, where its cache breakpoints fall, how its output is read
(thinking, tool calls), and why it stopped in Anthropic's terms."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fastapi import Request
from starlette.concurrency import run_in_threadpool

from warmfleet_common.agent_apis.chat import TOOLS, TTL_SECONDS, ChatOptions, ChatPrompt
from warmfleet_common.prompts import PromptError, PromptTooLong, RenderedPrompt
from warmfleet_daemon.api import generation as gen
from warmfleet_daemon.api.constraints import OutputRules, output_constraints
from warmfleet_daemon.api.errors import APIError
from warmfleet_daemon.api.output import Splitter, ThinkingMarkers, thinking_markers
from warmfleet_daemon.api.tenants import current_tenant
from warmfleet_daemon.engine.requests import Event, GenerationRequest
from warmfleet_daemon.engine.sampling import SamplingParams
from warmfleet_daemon.runtime.assembly import Ready
from warmfleet_daemon.settings import DaemonSettings


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
        return gen.output_splitter(
            ready.model.tokenizer, self.chat.tools if parse else None, self.prompt.text
        )


async def render_agent_prompt(
    ready: Ready, chat: ChatPrompt, options: ChatOptions, http: Request | None
) -> RenderedPrompt:
    """The prompt as the engine sees it; a 400 when it does not fit the context."""
    context = ready.model.context_length
    try:
        return await gen.while_connected(
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
    cache_salt: str | None = None,
) -> AgentRequest:
    """Render and check an agent request. `max_tokens` beyond what the context leaves
    (or --max-output-tokens) is served up to that (None: up to it); 0 only prefills the
    prompt (its blocks are stored, nothing is generated)."""
    rules = OutputRules(chat.tools, options)
    grammar, stops = await run_in_threadpool(output_constraints, ready, rules)
    prompt = gen.salted(await render_agent_prompt(ready, chat, options, http), cache_salt)
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
        tenant=current_tenant(),
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
