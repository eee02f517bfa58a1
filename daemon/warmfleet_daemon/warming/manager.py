"""Warm sets: prompts pushed by the operator (or read from `--warm-prompts`) whose
strict prefix is prefilled into the prefix cache, pinned, and re-warmed when they
change or the cache is cleared.

A prompt's prefix is what every request continuing its conversation with one more
user message shares (`PromptBuilder.shared_prefix`), tokenized exactly like those
requests and prefilled in the same chunks, so a request finds all of it cached.
Warm-ups go through the engine like any request (the port stays open; real requests
interleave and are scheduled first since they are shorter) with bounded concurrency
per set. Applying a set validates everything first and changes nothing on error.

A set scoped to tenants (`tenants`) warms each prompt once per tenant, keyed in that
tenant's cache namespace; a fleet-wide set warms it once, unsalted, and its blocks
(when pinned) are the engine's shared set: the run of them a tenant's request starts
with is keyed as they are, so every tenant hits them (`chunking`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace

from warmfleet_common.agent_apis.shapes import SHAPES
from warmfleet_common.contract import (
    CacheClearResult,
    PromptState,
    WarmPrompt,
    WarmSetSpec,
    WarmSetStatus,
)
from warmfleet_common.prompts import PromptBuilder, PromptError, RenderedPrompt
from warmfleet_common.tenancy import cache_salt
from warmfleet_daemon.engine.core import Engine
from warmfleet_daemon.engine.requests import Event, GenerationRequest
from warmfleet_daemon.engine.sampling import SamplingParams
from warmfleet_daemon.kvtransfer.transfer import KVTransfer
from warmfleet_daemon.support.background import BackgroundThread
from warmfleet_daemon.warming.sets import (
    Limits,
    PromptEntry,
    Rendered,
    SetEntry,
    SetKey,
    StateNotSaved,
    WarmRound,
    WarmSetError,
    WarmSetInvalid,
    WarmSetStale,
    WarmSetTooLarge,
    content_of,
    entry_id,
    hash_of,
    scopes,
)
from warmfleet_daemon.warming.state_store import StateStore, StateTooLarge, invalid_key

log = logging.getLogger(__name__)


class WarmManager:
    def __init__(
        self,
        engine: Engine,
        prompts: PromptBuilder,
        *,
        limits: Limits | None = None,
        store: StateStore | None = None,
        transfer: KVTransfer | None = None,
    ) -> None:
        self.engine = engine
        self.transfer = transfer  # blocks from disk or peers before a prefill
        self.prompts = prompts
        self.limits = limits or Limits()
        self.store = store
        self._sets: dict[SetKey, SetEntry] = {}
        self._lock = threading.RLock()
        self._worker = BackgroundThread("warmfleet-warmup", self._lock)
        self._epoch = 0
        self._round: WarmRound | None = None
        # Called with (namespace, name, "warm" | "failed", seconds) after each warm-up.
        self.observers: list[Callable[[str, str, str, float], None]] = []

    # -- lifecycle ----------------------------------------------------------------

    def start(self) -> None:
        self._worker.start(self._run)

    def stop(self) -> None:
        self._worker.stop()

    def restore(self) -> int:
        """Re-apply the sets saved in the state directory. Returns how many."""
        if self.store is None:
            return 0
        applied = 0
        rejected: list[tuple[object, str]] = []
        for (namespace, name), spec in self.store.load().items():
            try:
                self.apply(namespace, name, spec, persist=False)
                applied += 1
            except WarmSetError as exc:
                item = {"namespace": namespace, "name": name, "spec": spec.model_dump(mode="json")}
                rejected.append((item, exc.message))
        if rejected:  # kept, not lost at the next save
            self.store.keep_aside(rejected)
        if applied:
            log.info("Restored %d warm set(s) from %s", applied, self.store.path)
        return applied

    # -- the push API -------------------------------------------------------------

    def apply(
        self,
        namespace: str,
        name: str,
        spec: WarmSetSpec,
        *,
        persist: bool = True,
        keep_going: bool = False,
    ) -> WarmSetStatus:
        """Create or update a set; re-warm only prompts whose prefix changed. A prompt
        that cannot be rendered rejects the whole set, or with `keep_going` (a file read
        at start-up) is kept as failed, with its reason, while the others warm."""
        problem = invalid_key(namespace, name)
        if problem:
            raise WarmSetInvalid(problem, "name")
        rendered = self._validate(namespace, name, spec, keep_going)
        set_hash = hash_of(
            [
                spec.concurrency,
                spec.pin,
                spec.tenants,
                [(n, content_of(r)) for n, r in rendered.items()],
            ]
        )
        with self._lock:
            key = (namespace, name)
            old = self._sets.get(key)
            if (
                old is not None
                and spec.uid == old.spec.uid
                and spec.generation < old.spec.generation
            ):
                raise WarmSetStale(
                    f"generation {spec.generation} is older than the applied "
                    f"{old.spec.generation}; nothing changed",
                    "generation",
                )
            # Saved before anything changes: if the disk refuses, memory stays as it was.
            self._save(persist, {**self._specs(), key: spec})
            if old is not None and old.content_hash == set_hash:
                old.spec = spec  # same content: only the generation or uid differs
                old.updated_at = time.time()
                return old.status()
            entries: dict[str, PromptEntry] = {}
            for prompt in spec.prompts:
                for tenant in scopes(spec):
                    eid = entry_id(prompt.name, tenant)
                    result = rendered[eid]
                    if isinstance(result, str):  # keep_going: rendered as failed
                        entries[eid] = PromptEntry(
                            prompt,
                            RenderedPrompt(()),
                            [],
                            "",
                            PromptState.FAILED,
                            error=result,
                            tenant=tenant,
                        )
                        log.warning("Warm prompt %s/%s:%s failed: %s", namespace, name, eid, result)
                        continue
                    tokens, keys, content_hash = result
                    kept = old.prompts.get(eid) if old else None
                    if kept is not None and kept.content_hash == content_hash:
                        kept.spec = prompt
                        entries[eid] = kept
                    else:
                        entries[eid] = PromptEntry(
                            prompt, tokens, keys, content_hash, tenant=tenant
                        )
            if old is not None:
                for prompt_name, entry in old.prompts.items():
                    if entries.get(prompt_name) is not entry:
                        self._release(entry)
                if old.spec.pin and not spec.pin:
                    for entry in entries.values():
                        self._release(entry, drop=False)
                elif spec.pin and not old.spec.pin:
                    for entry in entries.values():
                        self._repin(entry)
            self._sets[key] = SetEntry(namespace, name, spec, set_hash, entries)
            self._share()
            self._sync_snapshots()
            self._worker.wake.notify_all()
            return self._sets[key].status()

    def delete(self, namespace: str, name: str) -> bool:
        """Remove a set: unpin its prompts and drop their blocks."""
        with self._lock:
            if (namespace, name) not in self._sets:
                return False
            remaining = self._specs()
            del remaining[(namespace, name)]
            self._save(True, remaining)  # first: a failed save changes nothing
            removed = self._sets.pop((namespace, name))
            for entry in removed.prompts.values():
                self._release(entry)
            self._share()
            self._sync_snapshots()
            return True

    def get(self, namespace: str, name: str) -> WarmSetStatus | None:
        with self._lock:
            found = self._sets.get((namespace, name))
            return found.status() if found else None

    def list(self) -> list[WarmSetStatus]:
        with self._lock:
            return [s.status() for s in self._sets.values()]

    def clear_cache(self) -> CacheClearResult:
        """Really clear the prefix cache, then re-warm every prompt in the background."""
        with self._lock:
            removed = self.engine.clear_prefix_cache()
            self._epoch += 1
            for entry in self._entries():
                entry.pinned = False
                if entry.state is not PromptState.WARMING:
                    entry.state = PromptState.PENDING
            scheduled = any(True for _ in self._entries())
            self._worker.wake.notify_all()
        return CacheClearResult(rewarm_scheduled=scheduled, entries_removed=removed)

    def readiness(self) -> tuple[bool, str]:
        """(every active prompt is warm, a short reason when not)."""
        with self._lock:
            entries = list(self._entries())
        failed = [e.id for e in entries if e.state is PromptState.FAILED]
        waiting = [e.id for e in entries if e.state is not PromptState.WARM]
        if failed:
            return False, f"warm-up failed for: {', '.join(failed)}"
        if waiting:
            return False, f"{len(waiting)} of {len(entries)} warm prompts not warm yet"
        return True, f"{len(entries)} warm prompts warm"

    # -- validation ---------------------------------------------------------------

    def _validate(
        self, namespace: str, name: str, spec: WarmSetSpec, keep_going: bool
    ) -> dict[str, Rendered | str]:
        limits = self.limits
        with self._lock:
            if (namespace, name) not in self._sets and len(self._sets) >= limits.max_sets:
                raise WarmSetInvalid(f"too many warm sets (at most {limits.max_sets})")
        if len(spec.prompts) > limits.max_prompts_per_set:
            raise WarmSetInvalid(
                f"{len(spec.prompts)} prompts; at most {limits.max_prompts_per_set} per set",
                "prompts",
            )
        out: dict[str, Rendered | str] = {}
        for i, prompt in enumerate(spec.prompts):
            tenants = scopes(spec)
            try:
                rendered = self._render(prompt, f"prompts.{i}")
            except WarmSetError as exc:
                if not keep_going:
                    raise
                out.update({entry_id(prompt.name, t): exc.message for t in tenants})
                continue
            for tenant in tenants:
                out[entry_id(prompt.name, tenant)] = self._scoped(rendered, tenant)
        good = {n: r for n, r in out.items() if not isinstance(r, str)}
        if spec.pin and good:
            self._check_budget(namespace, name, good)
        return out

    def _scoped(self, rendered: RenderedPrompt, tenant: str | None) -> Rendered:
        """The prefix as `tenant`'s requests key it (None: unsalted, every tenant's)."""
        salted = replace(rendered, salt=cache_salt(tenant))
        keys = [c.key for c in self.engine.plan(salted)]
        content = [list(rendered.tokens), rendered.cuts]
        return salted, keys, hash_of(content if tenant is None else [*content, tenant])

    def _render(self, prompt: WarmPrompt, param: str) -> RenderedPrompt:
        limit = self.limits.max_message_chars
        for j, message in enumerate(prompt.messages or []):
            if message.text_length() > limit:
                raise WarmSetTooLarge(
                    f"prompt {prompt.name!r} message {j} has {message.text_length()} "
                    f"characters; the limit is {limit}",
                    f"{param}.messages.{j}",
                )
        chat, options = prompt.chat()  # as the route of the prompt's API renders it
        for j, rendered_message in enumerate(chat.messages if prompt.messages is None else []):
            size = len(rendered_message.get("content") or "")
            if size > limit:
                raise WarmSetTooLarge(
                    f"prompt {prompt.name!r} ({prompt.api}) renders a "
                    f"{rendered_message['role']} message of {size} characters (message {j}); "
                    f"the limit is {limit}",
                    f"{param}.{SHAPES[prompt.api].prompt_field}",
                )
        try:
            rendered = self.prompts.shared_prefix(
                chat.messages, chat.tools, chat.template_kwargs(options)
            )
        except PromptError as exc:
            raise WarmSetInvalid(f"prompt {prompt.name!r}: {exc}", param) from exc
        context = self.engine.loaded.context_length
        if len(rendered.tokens) >= context:
            raise WarmSetInvalid(
                f"prompt {prompt.name!r} has {len(rendered.tokens)} tokens before the user "
                f"message; the model's context is {context}",
                param,
            )
        return rendered

    def _check_budget(self, namespace: str, name: str, rendered: dict[str, Rendered]) -> None:
        budget = self.engine.config.cache_budget_bytes
        allowed = int(budget * self.limits.max_pinned_fraction)
        need = sum(self.engine.block_bytes(len(r[0].tokens)) for r in rendered.values())
        with self._lock:
            others = sum(
                self.engine.block_bytes(len(p.rendered.tokens))
                for s in self._sets.values()
                if (s.namespace, s.name) != (namespace, name) and s.spec.pin
                for p in s.prompts.values()
            )
        if others + need > allowed:
            mib = 1 << 20
            raise WarmSetTooLarge(
                f"the set needs about {need / mib:.1f} MiB of pinned prefix cache; "
                f"{allowed / mib:.1f} MiB may be pinned ({self.limits.max_pinned_fraction:.0%} "
                f"of the {budget / mib:.1f} MiB budget) and other sets pin "
                f"{others / mib:.1f} MiB",
                "prompts",
            )

    # -- warm-up scheduling ---------------------------------------------------------

    def _run(self) -> None:
        with self._lock:
            while not self._worker.stopping:
                for warm_set in list(self._sets.values()):
                    in_flight = sum(
                        p.state is PromptState.WARMING for p in warm_set.prompts.values()
                    )
                    for entry in warm_set.prompts.values():
                        if in_flight >= warm_set.spec.concurrency:
                            break
                        if entry.state is PromptState.PENDING:
                            self._launch(warm_set, entry)
                            in_flight += 1
                self._worker.wake.wait(timeout=1.0)

    def _launch(self, warm_set: SetEntry, entry: PromptEntry) -> None:
        entry.state = PromptState.WARMING
        entry.error = None
        entry.epoch = self._epoch
        if self._round is None:
            self._round = WarmRound()
        request = GenerationRequest(
            entry.rendered,
            SamplingParams(max_tokens=1, temperature=0.0),
            prefill_only=True,
            pin=warm_set.spec.pin and not entry.pinned,
            tenant=entry.tenant,  # a scoped warm-up takes its tenant's turns
        )
        started = time.perf_counter()
        label = f"{warm_set.namespace}/{warm_set.name}:{entry.id}"

        def done(event: Event) -> None:  # on the engine thread
            if event.finish_reason is not None:
                self._finished(warm_set, entry, event, started, label)

        def submit() -> None:
            try:
                self.engine.submit(request, done)
            except Exception as exc:  # e.g. the engine refused the prompt
                done(Event("", finish_reason="error", error=str(exc)))

        if self.transfer is not None:  # what disk or peers have is not prefilled
            self.transfer.restorer.restore_then(entry.rendered, warm_set.spec.peer_refs(), submit)
        else:
            submit()

    def _finished(
        self, warm_set: SetEntry, entry: PromptEntry, event: Event, started: float, label: str
    ) -> None:
        with self._lock:
            current = self._sets.get((warm_set.namespace, warm_set.name))
            live = current is not None and current.prompts.get(entry.id) is entry
            pinned_now = event.finish_reason == "prefilled" and warm_set.spec.pin
            if not live:  # replaced or deleted while warming: give back what it pinned
                if pinned_now and not entry.pinned:
                    self.engine.cache.unpin(entry.keys)
            elif entry.epoch != self._epoch:  # the cache was cleared meanwhile
                if pinned_now and not entry.pinned:
                    self.engine.cache.unpin(entry.keys)
                entry.state = PromptState.PENDING
            elif event.finish_reason == "prefilled":
                cached = event.usage.cached_tokens if event.usage else 0
                entry.state = PromptState.WARM
                entry.pinned = entry.pinned or pinned_now
                entry.computed_tokens = len(entry.rendered.tokens) - cached
                entry.duration_s = time.perf_counter() - started
                entry.warmed_at = time.time()
                self._note(entry, label, ok=True)
                self._sync_snapshots()
            else:
                entry.state = PromptState.FAILED
                entry.error = event.error or f"warm-up ended with {event.finish_reason}"
                self._note(entry, label, ok=False)
            if live and entry.state in (PromptState.WARM, PromptState.FAILED):
                for observe in self.observers:
                    observe(
                        warm_set.namespace,
                        warm_set.name,
                        entry.state.value,
                        time.perf_counter() - started,
                    )
            self._maybe_report()
            self._worker.wake.notify_all()

    def _note(self, entry: PromptEntry, label: str, *, ok: bool) -> None:
        r = self._round or WarmRound()
        self._round = r
        if not ok:
            r.failed += 1
            log.warning("Warm-up of %s failed: %s", label, entry.error)
            return
        r.completed += 1
        r.tokens += len(entry.rendered.tokens)
        if entry.computed_tokens == 0:
            r.skipped += 1
        done, total = self._progress()
        log.info(
            "Warm-up %d/%d: %s warm, %d tokens (%d computed) in %.2fs",
            done,
            total,
            label,
            len(entry.rendered.tokens),
            entry.computed_tokens or 0,
            entry.duration_s or 0.0,
        )

    def _maybe_report(self) -> None:
        busy = any(e.state in (PromptState.PENDING, PromptState.WARMING) for e in self._entries())
        if busy or self._round is None:
            return
        r, self._round = self._round, None
        log.info(
            "Warm-up done (strict-prefix): %d completed, %d skipped, %d failed, "
            "%d prompt tokens in %.1fs",
            r.completed - r.skipped,
            r.skipped,
            r.failed,
            r.tokens,
            time.perf_counter() - r.started,
        )

    # -- helpers ----------------------------------------------------------------

    def _entries(self) -> Iterator[PromptEntry]:
        return (e for s in self._sets.values() for e in s.prompts.values())

    def _progress(self) -> tuple[int, int]:
        entries = list(self._entries())
        return sum(e.state is PromptState.WARM for e in entries), len(entries)

    def _release(self, entry: PromptEntry, *, drop: bool = True) -> None:
        if entry.pinned:
            self.engine.cache.unpin(entry.keys)
            entry.pinned = False
        if drop:
            self.engine.cache.drop(entry.keys)

    def _repin(self, entry: PromptEntry) -> None:
        if entry.state is PromptState.WARM and not entry.pinned:
            if self.engine.cache.pin(entry.keys):
                entry.pinned = True
            else:
                entry.state = PromptState.PENDING

    def _share(self) -> None:
        """The engine's shared set: the blocks of every pinned fleet-wide set's prompts
        (unpinned ones would be evicted as others' traffic goes: not shared)."""
        self.engine.shared = frozenset(
            key
            for s in self._sets.values()
            if s.spec.pin and s.spec.tenants is None
            for e in s.prompts.values()
            for key in e.keys
        )

    def _specs(self) -> dict[SetKey, WarmSetSpec]:
        return {k: s.spec for k, s in self._sets.items()}

    def _save(self, persist: bool, specs: dict[SetKey, WarmSetSpec]) -> None:
        """Write what the sets are about to be; WarmSetError (nothing changed) if not."""
        if not persist or self.store is None:
            return
        try:
            self.store.save(specs)
        except StateTooLarge as exc:
            raise WarmSetTooLarge(f"{exc}; nothing changed", "prompts") from exc
        except OSError as exc:
            log.error("warm-set state not saved to %s: %s", self.store.path, exc)
            raise StateNotSaved(
                f"the warm-set state cannot be saved ({exc}); nothing changed"
            ) from exc

    def _sync_snapshots(self) -> None:
        """Keep every pinned set's blocks on disk; store the warm ones (in the background)."""
        if self.transfer is None or self.transfer.snapshots is None:
            return  # snapshots off: nothing to list under the lock
        pinned = [e for s in self._sets.values() if s.spec.pin for e in s.prompts.values()]
        self.transfer.sync_snapshots(
            (k for e in pinned for k in e.keys),
            (e.keys for e in pinned if e.state is PromptState.WARM and e.pinned),
        )
