"""The next turn's prefix, ready before it arrives.

After a response ends, the conversation it belongs to will most likely come back with
the answer appended and one more message (a user's, or the results of the tool calls
it made). That request starts with a prefix known now: the conversation plus the answer
as the API returned it, up to where the next message's content starts. It is rendered
here, off the event loop, by the prompt builder (probe contents, the same cuts and so
the same chunk plan as that request), and prefilled at idle priority: the engine
computes it, as a prefill would, only in steps with nothing else to do, so the next
request computes only what is new and the cache invariant holds as for any block.

Rendering is bounded: a few requests wait here at most (the oldest give way), and a
conversation whose prefix cannot be rendered (a template without a stable cut) is
skipped, counted and logged at debug level.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from warmfleet_common.prompts import PromptBuilder, PromptError
from warmfleet_daemon.engine.core import Engine
from warmfleet_daemon.engine.requests import EngineError, Event, GenerationRequest
from warmfleet_daemon.engine.sampling import SamplingParams

log = logging.getLogger(__name__)

_MAX_PENDING = 16  # conversations waiting to be rendered; beyond, the oldest give way


@dataclass(frozen=True)
class Continuation:
    """A conversation with its answer appended, as the next request will render it."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    template_kwargs: Mapping[str, Any] | None = None
    tool_call_ids: tuple[str, ...] = ()
    salt: bytes = b""  # the request's cache salt: the next turn is keyed as it will be


@dataclass(frozen=True)
class NextTurnStats:
    scheduled: int  # responses whose next prefix was asked for
    submitted: int  # prefixes handed to the engine
    prefilled: int  # prefixes the engine finished (stored)
    skipped: int  # not renderable, too long, or gave way to newer ones
    pending: int  # waiting to be rendered, or in the engine's idle queue


class NextTurns:
    def __init__(self, engine: Engine, prompts: PromptBuilder) -> None:
        self.engine = engine
        self.prompts = prompts
        # (the engine's clears when it was scheduled, what renders the conversation)
        self._pending: deque[tuple[int, Callable[[], Continuation | None]]] = deque()
        self._lock = threading.Condition()
        self._stopping = False
        self._scheduled = self._submitted = self._prefilled = self._skipped = 0
        self._working = 0  # being rendered, or submitted and not finished
        self._thread = threading.Thread(target=self._run, name="warmfleet-next-turn", daemon=True)
        self._thread.start()

    @property
    def enabled(self) -> bool:
        return self.engine.config.cache_budget_bytes > 0

    def after(self, build: Callable[[], Continuation | None]) -> None:
        """Prefill the next turn of the conversation `build()` returns (called on this
        module's thread: translating a large request is not the event loop's work)."""
        if not self.enabled:
            return
        clears = self.engine.clears  # a clear from now on drops this conversation's prefix
        with self._lock:
            self._scheduled += 1
            self._pending.append((clears, build))
            while len(self._pending) > _MAX_PENDING:
                self._pending.popleft()
                self._skipped += 1
            self._lock.notify()

    def stats(self) -> NextTurnStats:
        with self._lock:
            return NextTurnStats(
                self._scheduled,
                self._submitted,
                self._prefilled,
                self._skipped,
                len(self._pending) + self._working,
            )

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
            self._lock.notify()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while True:
            with self._lock:
                self._lock.wait_for(lambda: self._pending or self._stopping)
                if self._stopping:
                    return
                clears, build = self._pending.popleft()
                self._working += 1
            try:
                self._submit(build, clears)
            except Exception:  # a bad conversation never stops the next ones
                log.exception("the next turn's prefix could not be prepared")
                self._count_skip()
            finally:
                with self._lock:
                    self._working -= 1

    def _submit(self, build: Callable[[], Continuation | None], clears: int) -> None:
        continuation = build()
        if continuation is None:
            return self._count_skip()
        try:
            prefixes = self.prompts.next_turn(
                continuation.messages,
                continuation.tools,
                tool_call_ids=continuation.tool_call_ids,
                template_kwargs=continuation.template_kwargs,
            )
        except PromptError as exc:
            log.debug("no next-turn prefix for this conversation: %s", exc)
            return self._count_skip()
        for prefix in prefixes:
            if len(prefix.tokens) >= self.engine.loaded.context_length:
                self._count_skip()
                continue
            request = GenerationRequest(
                replace(prefix, salt=continuation.salt),
                SamplingParams(max_tokens=1, temperature=0.0),
                prefill_only=True,
                idle=True,
            )
            with self._lock:
                self._working += 1
            try:
                self.engine.submit(request, self._finished, clears_seen=clears)
            except EngineError as exc:
                log.debug("next-turn prefix not submitted: %s", exc)
                with self._lock:
                    self._working -= 1
                self._count_skip()
                continue
            with self._lock:
                self._submitted += 1

    def _finished(self, event: Event) -> None:  # engine thread
        if event.finish_reason is None:
            return
        with self._lock:
            self._working -= 1
            self._prefilled += event.finish_reason == "prefilled"

    def _count_skip(self) -> None:
        with self._lock:
            self._skipped += 1


def tool_call_ids(calls: Sequence[Mapping[str, Any]]) -> tuple[str, ...]:
    """The ids of OpenAI-shaped tool calls (what the next request's results answer)."""
    return tuple(str(c.get("id") or f"call_{i}") for i, c in enumerate(calls))
