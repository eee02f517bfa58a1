"""From `profiling`'s samples to a performance profile: each run's rates, their medians
over the runs, the spread in the profile's notes; and the machine this is, for a local
daemon. Plain arithmetic, no HTTP: tests feed it samples."""

from __future__ import annotations

import datetime as dt
import os
import platform
import re
import statistics
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from warmfleet_cli.bench_serve.profiling import Measurements, RunSample
from warmfleet_cli.bench_serve.serve import BenchError
from warmfleet_common.perf_profile import PerfProfile, RatePoint
from warmfleet_common.tiers import Tier


@dataclass(frozen=True)
class RunRates:
    """One run's figures (tokens/s), None where it could not be measured."""

    ram: float | None
    disk: float | None
    prefill: dict[int, float]  # position -> marginal rate
    decode: dict[int, float]  # batch -> per sequence
    decode_by_context: dict[int, float]  # context -> batch-1 rate
    kv_bytes_per_token: float | None
    logits_bytes: int | None


def ram_seconds_per_token(run: RunSample) -> float | None:
    """The slope of the fully cached prompts' restore gaps against the tokens restored
    (least squares over the cached block and every position's cached repeat): what one
    more token restored from RAM adds. None if it is not positive (too fast to see)."""
    found = [(run.tiny_tokens, run.tiny_restore_gap_s)]
    found += [(p.chunk.end, p.restore_gap_s) for p in run.positions]
    points = [(x, y) for x, y in found if y is not None]
    if len({x for x, _ in points}) < 2:
        return None
    mean_x = statistics.fmean(x for x, _ in points)
    mean_y = statistics.fmean(y for _, y in points)
    covariance = sum((x - mean_x) * (y - mean_y) for x, y in points)
    variance = sum((x - mean_x) ** 2 for x, _ in points)
    slope = covariance / variance
    return slope if slope > 0 else None


def run_rates(run: RunSample) -> RunRates:
    ram_s = ram_seconds_per_token(run)
    prefill: dict[int, float] = {}
    for p in run.positions:
        size = p.chunk.end - p.chunk.start
        # The extension restored its cached start before computing; the cached repeat's
        # first token restored nothing (it came from the stored logits).
        seconds = p.extend_ttft_s - p.cached_ttft_s - p.chunk.start * (ram_s or 0.0)
        if seconds > 0:
            prefill[p.chunk.position] = size / seconds
    disk = None
    if run.disk is not None:
        d = run.disk
        seconds = d.disk_ttft_s - d.ram_ttft_s + (d.ram_tokens - d.disk_ram_tokens) * (ram_s or 0)
        disk = d.disk_tokens / seconds if seconds > 0 else None
    return RunRates(
        ram=1.0 / ram_s if ram_s else None,
        disk=disk,
        prefill=prefill,
        decode=dict(run.decode),
        decode_by_context={
            p.decode_context: p.decode_tokens_per_s
            for p in run.positions
            if p.decode_tokens_per_s is not None
        },
        kv_bytes_per_token=run.kv_bytes_per_token,
        logits_bytes=run.logits_bytes,
    )


def build_profile(
    measured: Measurements,
    *,
    name: str,
    machine: str,
    model: str | None = None,
    today: dt.date | None = None,
) -> PerfProfile:
    """The profile: each figure the median over the runs; the notes say each figure's
    spread (min-max over the runs) and what was not measured."""
    facts, opts = measured.facts, measured.options
    rates = [run_rates(r) for r in measured.runs]
    if not rates:
        raise BenchError("no run was measured")
    notes = [f"medians over {len(rates)} run(s), [min-max] in brackets"]
    prefill = _points(rates, lambda r: r.prefill)
    decode = _points(rates, lambda r: r.decode)
    by_context = _points(rates, lambda r: r.decode_by_context)
    if not prefill or not decode:
        raise BenchError("no prefill or no decode rate could be measured")
    notes.append(f"prefill tokens/s at: {_spread(rates, lambda r: r.prefill)}")
    notes.append(
        f"decode tokens/s per sequence by batch at context "
        f"{measured.runs[0].decode_context}: {_spread(rates, lambda r: r.decode)}"
    )
    notes.append(f"batch-1 decode tokens/s at: {_spread(rates, lambda r: r.decode_by_context)}")
    restore: dict[Tier, float] = {}
    tiers: tuple[tuple[Tier, Callable[[RunRates], float | None]], ...] = (
        ("ram", _ram),
        ("disk", _disk),
    )
    for tier, get in tiers:
        values = [v for r in rates if (v := get(r)) is not None]
        if values:
            restore[tier] = round(statistics.median(values), 1)
            notes.append(f"{tier} restore tokens/s: {_range(values)}")
    if "ram" not in restore:
        notes.append("ram restore: too fast to measure here (TTFT does not grow with it)")
    if "disk" not in restore and not facts.disk_tier:
        notes.append("disk restore: not measured, the daemon has no disk tier")
    elif "disk" not in restore and any(r.disk is not None for r in measured.runs):
        notes.append("disk restore: no slower than RAM here, left out")
    notes.append("peer restore: not measured (one daemon)")
    kv = facts.kv_bytes_per_token
    derived = [r.kv_bytes_per_token for r in rates if r.kv_bytes_per_token]
    if kv is None:
        if not derived:
            raise BenchError("the daemon reports no KV bytes per token and its cache did not grow")
        kv = round(statistics.median(derived))
        notes.append("kv_bytes_per_token from the cache's growth (the daemon reports none)")
    elif derived and abs(statistics.median(derived) - kv) > 0.01 * kv:
        notes.append(
            f"the cache grew {statistics.median(derived):.0f} bytes per token; "
            f"the daemon reports {kv}"
        )
    logits = [r.logits_bytes for r in rates if r.logits_bytes is not None]
    notes.extend(measured.notes)
    when = (today or dt.date.today()).isoformat()
    return PerfProfile(
        name=name,
        machine=machine,
        model=model or facts.model,
        source=(
            f"measured by warmfleet bench-serve {measured.version} against {facts.url} on {when}"
        ),
        context_length=facts.context_length,
        block_size=facts.block_size,
        kv_bytes_per_token=kv,
        logits_bytes=max(0, round(statistics.median(logits))) if logits else 0,
        memory_budget_bytes=facts.budget_bytes,
        prefill=prefill,
        decode=decode,
        decode_reference_context=measured.runs[0].decode_context,
        decode_by_context=by_context,
        restore=restore,
        notes="; ".join(notes)
        + f". Each decode sample: {opts.decode_tokens} tokens, timed from the second (a "
        "cached prompt restores its caches after the first).",
    )


def _ram(r: RunRates) -> float | None:
    return r.ram


def _disk(r: RunRates) -> float | None:
    return r.disk


def _points(
    rates: Sequence[RunRates], get: Callable[[RunRates], dict[int, float]]
) -> tuple[RatePoint, ...]:
    ats = sorted({at for r in rates for at in get(r)})
    return tuple(
        RatePoint(
            at=at, tokens_per_s=_round(statistics.median(get(r)[at] for r in rates if at in get(r)))
        )
        for at in ats
    )


def _spread(rates: Sequence[RunRates], get: Callable[[RunRates], dict[int, float]]) -> str:
    ats = sorted({at for r in rates for at in get(r)})
    return ", ".join(f"{at}: {_range([get(r)[at] for r in rates if at in get(r)])}" for at in ats)


def _range(values: Sequence[float]) -> str:
    median = statistics.median(values)
    if len(values) < 2:
        return f"{_round(median):g}"
    return f"{_round(median):g} [{_round(min(values)):g}-{_round(max(values)):g}]"


def _round(value: float) -> float:
    """Three significant figures: what a run-to-run spread of a few percent supports."""
    return float(f"{value:.3g}")


def profile_name(path: str) -> str:
    """A profile's default name: its file's, as the schema spells names."""
    stem = os.path.basename(path).removesuffix(".json").lower()
    name = re.sub(r"[^a-z0-9._-]+", "-", stem).strip("-._")
    return name or "measured"


def this_machine() -> str:
    """This machine's CPU (its model name, and on x86 family and model), cores, memory
    and OS."""
    cpu = ""
    if platform.system() == "Darwin":
        cpu = _run(["sysctl", "-n", "machdep.cpu.brand_string"])
    else:
        fields: dict[str, str] = {}
        try:
            with open("/proc/cpuinfo", encoding="utf-8") as f:
                for line in f:
                    key, _, value = line.partition(":")
                    fields.setdefault(key.strip(), value.strip())
        except OSError:
            pass
        cpu = fields.get("model name", "")
        if "cpu family" in fields and "model" in fields:
            cpu += f" (family {fields['cpu family']} model {fields['model']})"
    cpu = cpu.strip() or platform.processor() or "unknown CPU"
    parts = [cpu, f"{os.cpu_count() or '?'} cores"]
    memory = _memory_bytes()
    if memory:
        parts.append(f"{memory / 2**30:.0f} GiB RAM")
    parts.append(f"{platform.system()} {platform.machine()}")
    return ", ".join(parts)


def _memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _run(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def summary(profile: PerfProfile) -> str:
    """The profile in a few lines, as `bench-serve --profile-out` prints it."""

    def points(values: Sequence[RatePoint]) -> str:
        return ", ".join(f"{p.at}: {p.tokens_per_s:g}" for p in values) or "none"

    restore = ", ".join(f"{t} {r:g}" for t, r in profile.restore.items()) or "none"
    return "\n".join(
        [
            f"profile {profile.name}: {profile.model} on {profile.machine}",
            f"  context {profile.context_length}, block {profile.block_size}, KV "
            f"{profile.kv_bytes_per_token} bytes/token, logits {profile.logits_bytes} bytes, "
            f"cache budget {profile.memory_budget_bytes / 2**30:.2f} GiB",
            f"  prefill tokens/s at context: {points(profile.prefill)}",
            f"  decode tokens/s per sequence by batch (context "
            f"{profile.decode_reference_context}): {points(profile.decode)}",
            f"  batch-1 decode tokens/s at context: {points(profile.decode_by_context)}",
            f"  restore tokens/s: {restore}",
        ]
    )
