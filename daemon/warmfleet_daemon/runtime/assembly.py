"""What the routes share: settings, and the engine once the model has loaded.

The model loads in a background thread so the port opens at once; until it is ready,
model routes answer 503 and `/readyz` says why.
"""

from __future__ import annotations

import dataclasses
import logging
import ssl
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from warmfleet_common.perf_profile import load_profile
from warmfleet_common.prompts import PromptBuilder
from warmfleet_common.tiers import TierCosts
from warmfleet_common.tls import client_verify
from warmfleet_daemon.cache.events import CacheEventLog
from warmfleet_daemon.engine.core import Engine
from warmfleet_daemon.engine.kv import BlockPayload
from warmfleet_daemon.engine.requests import EngineConfig
from warmfleet_daemon.engine.threads import on_a_thread_of_its_own
from warmfleet_daemon.kvtransfer.costs import measure_tier_costs
from warmfleet_daemon.kvtransfer.transfer import KVTransfer
from warmfleet_daemon.models.loader import LoadedModel, load_model
from warmfleet_daemon.runtime.diagnostics import CacheDiagnostics
from warmfleet_daemon.runtime.telemetry import Telemetry, TelemetryConfig, default_daemon_name
from warmfleet_daemon.settings import DaemonSettings, MiB
from warmfleet_daemon.sim.engine import SimEngine
from warmfleet_daemon.sim.loader import shared_prompt_builder, simulated_model
from warmfleet_daemon.warming.manager import WarmManager
from warmfleet_daemon.warming.next_turn import NextTurns
from warmfleet_daemon.warming.pins import TimedPins
from warmfleet_daemon.warming.sets import Limits, WarmSetError, read_warm_prompts_file
from warmfleet_daemon.warming.state_store import StateStore

log = logging.getLogger(__name__)


@dataclass
class Ready:
    engine: Engine
    prompts: PromptBuilder
    model_ids: frozenset[str]
    warm: WarmManager
    telemetry: Telemetry
    diagnostics: CacheDiagnostics
    events: CacheEventLog[BlockPayload]  # the router's feed: GET /v1/cache/events
    transfer: KVTransfer | None = None
    pins: TimedPins | None = None  # prefixes kept by cache_control (Anthropic)
    next_turn: NextTurns | None = None  # conversations' next prefixes, at idle priority
    costs: TierCosts | None = None  # what a token costs here per tier (the router weighs them)

    @property
    def model(self) -> LoadedModel:
        return self.engine.loaded


def with_context(
    loaded: LoadedModel, max_context: int | None, simulated: bool = False
) -> LoadedModel:
    """`--max-context N`: the context the daemon serves, whatever the model's config says
    (agents' first requests are longer than some small models' configured contexts)."""
    if max_context is None or max_context == loaded.context_length:
        return loaded
    if max_context > loaded.context_length and not simulated:  # no output to worsen
        log.warning(
            "Serving %s with a %d-token context, beyond the %d tokens it was configured "
            "for (--max-context): past that, its output is untested by its authors",
            loaded.name,
            max_context,
            loaded.context_length,
        )
    return dataclasses.replace(loaded, context_length=max_context)


@dataclass
class DaemonState:
    settings: DaemonSettings
    ready: Ready | None = None
    load_error: str | None = None
    started_at: float = field(default_factory=time.time)
    # New on every start: lets the operator tell a restarted daemon (sets lost) at once.
    instance_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    # Set by a SIGTERM (drain.py): when the daemon stops; until then it still serves.
    draining_until: float | None = None
    # Run once in the loading thread when the model is ready (the serve command's own
    # process-wide settings, such as freezing the startup heap; see cli.serve).
    on_ready: list[Callable[[], None]] = field(default_factory=list)
    _thread: threading.Thread | None = None
    # What peers are called with: their certificates verified with --tls-ca, this
    # daemon's own presented (None: plain HTTP, the system's CAs for https peers).
    tls_client: ssl.SSLContext | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        verify = client_verify(self.settings.tls())  # its certificate reloaded as it rotates
        self.tls_client = verify if isinstance(verify, ssl.SSLContext) else None

    def start_loading(self, loader: Callable[[str], LoadedModel] = load_model) -> None:
        def run() -> None:
            try:
                t0 = time.perf_counter()
                engine = self._build_engine(loader)
                self.attach(engine)
                log.info("Model %s ready in %.1fs", engine.loaded.name, time.perf_counter() - t0)
            except Exception as exc:  # reported on /readyz and in every 503 body
                log.exception("model %r failed to load", self.settings.model)
                self.load_error = f"{type(exc).__name__}: {exc}"
                return
            for hook in self.on_ready:  # the daemon serves whatever a hook does
                try:
                    hook()
                except Exception:
                    log.exception("on-ready hook %r failed", hook)

        self._thread = threading.Thread(target=run, name="warmfleet-load", daemon=True)
        self._thread.start()

    def _build_engine(self, loader: Callable[[str], LoadedModel]) -> Engine:
        settings = self.settings
        if settings.engine != "sim":
            loaded = with_context(loader(settings.model), settings.max_context)
            return Engine(loaded, self.engine_config(loaded))
        assert settings.profile is not None  # the settings say so
        profile = load_profile(settings.profile)
        loaded = with_context(simulated_model(profile), settings.max_context, simulated=True)
        config = self.engine_config(loaded)
        config = dataclasses.replace(
            config,
            block_size=settings.block_size or profile.block_size,
            cache_budget_bytes=(
                config.cache_budget_bytes
                if settings.cache_memory_mb is not None
                else profile.memory_budget_bytes
            ),
        )
        return SimEngine(
            loaded,
            config,
            profile,
            speed=settings.sim_speed,
            answer_tokens=settings.sim_answer_tokens,
        )

    def engine_config(self, loaded: LoadedModel) -> EngineConfig:
        return EngineConfig(
            block_size=self.settings.resolved_block_size(loaded.on_gpu),
            cache_budget_bytes=self.settings.cache_budget_bytes(),
            max_num_seqs=self.settings.max_num_seqs,
            prefill_aging_picks=self.settings.prefill_aging_picks,
            kv_bits=self.settings.kv_bits,
        )

    def attach(self, engine: Engine) -> None:
        """Serve `engine`: start it, then restore and warm the warm sets."""
        settings = self.settings
        # Listening before anything is stored, so the log misses no block.
        events = CacheEventLog[BlockPayload](lambda payload: payload.logits is not None)
        engine.cache.listeners.append(events.record)
        # Asked once: a simulated engine brings its codec, tier costs and clock (and a
        # hundred of them may share the process, so they share one prompt builder).
        sim = engine if isinstance(engine, SimEngine) else None
        transfer = KVTransfer(  # probes the model (not a simulated one): before the engine runs
            engine,
            state_dir=settings.state_dir,
            snapshot_budget_bytes=settings.snapshot_disk_mb * MiB,
            warm_from=settings.warm_from,
            peer_token=settings.admin_token,
            peer_tls=self.tls_client,
            peer_deadline_s=settings.warm_from_deadline_s,
            cache_dir=settings.resolved_cache_dir(),
            cache_disk_budget_bytes=settings.cache_disk_mb * MiB,
            spill=settings.spill,
            spill_deadline_s=settings.spill_deadline_s,
            codec=sim.codec() if sim is not None else None,
        )
        for tier in transfer.tiers:  # the disk, the peer copies of a spill
            engine.attach_tier(tier)
            tier.listeners.append(events.tier_listener(tier.name))  # the router follows
        if sim is not None:
            costs = sim.tier_costs()  # the profiled machine's
        else:
            # Measured before the engine's thread starts (the model is idle), on a thread of
            # its own that is gone before we go on (see on_a_thread_of_its_own).
            costs = on_a_thread_of_its_own(
                lambda: measure_tier_costs(engine, transfer.codec), "warmfleet-tier-costs"
            )
        transfer.spill.costs = costs  # what a spill's copy is weighed against
        engine.start()
        loaded = engine.loaded
        ids = {loaded.name, settings.model, "default"}
        if settings.served_model_name:
            ids.add(settings.served_model_name)
        prompts = shared_prompt_builder() if sim is not None else PromptBuilder(loaded.tokenizer)
        warm = WarmManager(
            engine,
            prompts,
            limits=Limits(
                max_sets=settings.max_warm_sets,
                max_prompts_per_set=settings.max_warm_prompts_per_set,
                max_message_chars=settings.max_warm_message_chars,
                max_pinned_fraction=settings.max_pinned_fraction,
            ),
            store=(
                StateStore(settings.state_dir, max_bytes=settings.max_state_mb * MiB)
                if settings.state_dir
                else None
            ),
            transfer=transfer,
        )
        telemetry = Telemetry(
            TelemetryConfig(
                daemon=settings.daemon_name or default_daemon_name(),
                model=settings.served_model_name or loaded.name,
                otlp_endpoint=settings.otlp_endpoint,
            )
        )
        telemetry.observe_engine(engine)
        telemetry.observe_warm_sets(warm)
        # At 0 without them: "off", not "No data".
        telemetry.observe_disk_tier(transfer.disk)
        telemetry.observe_spill(transfer.spill)
        telemetry.observe_sim_clock(sim.clock if sim is not None else None)
        diagnostics = CacheDiagnostics(prompts.decode)
        engine.observers.append(diagnostics.observe)
        diagnostics.start()
        budget, fraction = engine.config.cache_budget_bytes, settings.max_pinned_fraction
        pins = TimedPins(engine.cache, lambda: int(budget * fraction))
        pins.start()
        warm.start()
        warm.restore()
        if settings.warm_prompts:
            self._apply_warm_prompts_file(warm, settings.warm_prompts)
        # Ready only now: `/readyz?warm=1` must not see an empty, vacuously warm set list.
        next_turn = NextTurns(engine, prompts) if settings.next_turn_prefill else None
        self.ready = Ready(
            engine,
            prompts,
            frozenset(ids),
            warm,
            telemetry,
            diagnostics,
            events,
            transfer,
            pins,
            next_turn,
            costs,
        )

    def _apply_warm_prompts_file(self, warm: WarmManager, path: str) -> None:
        try:
            spec = read_warm_prompts_file(path, concurrency=self.settings.warm_prompts_concurrency)
            warm.apply("local", "warm-prompts", spec, persist=False, keep_going=True)
            log.info("Warming %d prompt(s) from %s in the background", len(spec.prompts), path)
        except (ValueError, WarmSetError) as exc:
            log.error("--warm-prompts %s not applied: %s", path, getattr(exc, "message", exc))

    def served_name(self) -> str:
        if self.settings.served_model_name:
            return self.settings.served_model_name
        return self.ready.model.name if self.ready else self.settings.model

    def shutdown(self) -> None:
        if self.ready is not None:
            self.ready.warm.stop()
            if self.ready.pins is not None:
                self.ready.pins.stop()
            self.ready.diagnostics.stop()
            if self.ready.next_turn is not None:
                self.ready.next_turn.stop()
            if self.ready.transfer is not None:
                self.ready.transfer.stop()
            self.ready.engine.stop()
            self.ready.telemetry.shutdown()
