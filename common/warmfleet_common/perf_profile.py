"""A machine's performance profile: how fast one Mac (or this machine) serves one model.

The simulated engine (`warmfleet serve --engine sim`) charges each prefill chunk and
decode step the time a profile says, so a fleet of simulated Macs queues, batches and
caches as the real ones would; `warmfleet bench-serve --profile-out` measures a real
daemon into one, and `warmfleet plan` sizes a fleet from one. Built-in profiles ship in
`perf_profiles/` (each names where its figures come from); a file path works as well.

Rates are tokens per second, interpolated linearly between measured points and held at
the nearest point outside them (a figure the profile does not have is never invented):

- `prefill`: the marginal prefill rate at a context position, i.e. of a chunk computed
  after `at` tokens are already in its caches (cached or computed): a prompt's uncached
  tail costs what it costs at its depth, which is how "how much is cached" enters;
- `decode`: each sequence's tokens/s at a batch size, at `decode_reference_context`;
- `decode_by_context`: one sequence's tokens/s at a context length (a deeper context
  slows every step of a batch by the same ratio);
- `restore`: tokens/s of cached blocks read into a prompt's caches, per tier.
"""

from __future__ import annotations

import json
from bisect import bisect_right
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from warmfleet_common.tiers import Tier

FORMAT: Final = "warmfleet-perf-profile/1"
_BUILTIN_PACKAGE: Final = "warmfleet_common.perf_profiles"


class ProfileError(ValueError):
    """A profile that cannot be used; the message says why."""


class RatePoint(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    at: int = Field(ge=0, description="context tokens (prefill), or batch size (decode)")
    tokens_per_s: float = Field(gt=0)


class PerfProfile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal["warmfleet-perf-profile/1"] = FORMAT
    name: str = Field(min_length=1, max_length=128, pattern=r"^[a-z0-9][a-z0-9._-]*$")
    machine: str = Field(min_length=1, description="the machine: chip, memory; the CPU model")
    model: str = Field(min_length=1, description="the model it served, with its precision")
    source: str = Field(min_length=1, description="where the figures come from")
    context_length: int = Field(gt=0)
    block_size: int = Field(ge=8, le=8192, description="the prefill chunk = cache block")
    kv_bytes_per_token: int = Field(gt=0)
    logits_bytes: int = Field(ge=0, description="the logits row kept with a prompt's last block")
    memory_budget_bytes: int = Field(ge=0, description="the prefix cache's budget there")
    prefill: tuple[RatePoint, ...] = Field(min_length=1)
    decode: tuple[RatePoint, ...] = Field(min_length=1)
    decode_reference_context: int = Field(ge=0)
    decode_by_context: tuple[RatePoint, ...] = ()
    restore: dict[Tier, float] = Field(default_factory=dict)
    notes: str = ""

    @model_validator(mode="after")
    def _sorted_points(self) -> PerfProfile:
        for field in ("prefill", "decode", "decode_by_context"):
            points: tuple[RatePoint, ...] = getattr(self, field)
            ats = [p.at for p in points]
            if ats != sorted(set(ats)):
                raise ValueError(f"{field}: points must be in increasing `at`, each once")
        if any(p.at < 1 for p in self.decode):
            raise ValueError("decode: batch sizes start at 1")
        bad = [t for t, rate in self.restore.items() if rate <= 0]
        if bad:
            raise ValueError(f"restore: rates must be positive ({', '.join(bad)})")
        return self

    # -- what the simulated engine charges ------------------------------------------------

    def prefill_seconds(self, start: int, end: int) -> float:
        """Computing the prompt tokens [start, end) after `start` are in the caches."""
        if end <= start:
            return 0.0
        return (end - start) / _interpolate(self.prefill, (start + end) / 2)

    def decode_step_seconds(self, batch: int, mean_context: float) -> float:
        """One decode step of a batch of `batch` sequences whose contexts average
        `mean_context` tokens. Past the largest measured batch the batch's total rate
        stays what it was there (the machine is saturated)."""
        if batch < 1:
            return 0.0
        widest = self.decode[-1]
        if batch > widest.at:
            per_sequence = widest.tokens_per_s * widest.at / batch
        else:
            per_sequence = _interpolate(self.decode, batch)
        seconds = 1.0 / per_sequence
        if self.decode_by_context:
            at_reference = _interpolate(self.decode_by_context, self.decode_reference_context)
            seconds *= at_reference / _interpolate(self.decode_by_context, mean_context)
        return seconds

    def restore_seconds(self, tier: Tier, tokens: int) -> float:
        """Reading `tokens` cached tokens from `tier` into a prompt's caches (0 when the
        profile has no figure for that tier)."""
        rate = self.restore.get(tier)
        return tokens / rate if rate else 0.0


def pooled(profile: PerfProfile, machines: int) -> PerfProfile:
    """`machines` of `profile` as one: their memory in one cache, their prefill rates
    summed, a batch `machines` times wider decoded in one machine's step time (the
    ideal a fleet's cache is measured against: no request ever on the wrong machine)."""
    if machines < 1:
        raise ValueError("machines must be >= 1")
    return profile.model_copy(
        update={
            "name": f"{profile.name}-x{machines}",
            "machine": f"{machines} x {profile.machine}, pooled",
            "memory_budget_bytes": profile.memory_budget_bytes * machines,
            "prefill": tuple(
                RatePoint(at=p.at, tokens_per_s=p.tokens_per_s * machines) for p in profile.prefill
            ),
            "decode": tuple(
                RatePoint(at=p.at * machines, tokens_per_s=p.tokens_per_s) for p in profile.decode
            ),
            "notes": f"pooled from {profile.name}: {machines} machines as one. {profile.notes}",
        }
    )


def _interpolate(points: Sequence[RatePoint], at: float) -> float:
    ats = [p.at for p in points]
    i = bisect_right(ats, at)
    if i == 0:
        return points[0].tokens_per_s
    if i == len(points):
        return points[-1].tokens_per_s
    left, right = points[i - 1], points[i]
    share = (at - left.at) / (right.at - left.at)
    return left.tokens_per_s + share * (right.tokens_per_s - left.tokens_per_s)


# -- finding one ------------------------------------------------------------------------


def builtin_profiles() -> list[str]:
    """The names of the profiles that ship with warmfleet."""
    folder = resources.files(_BUILTIN_PACKAGE)
    return sorted(
        p.name.removesuffix(".json") for p in folder.iterdir() if p.name.endswith(".json")
    )


def load_profile(name_or_path: str) -> PerfProfile:
    """A built-in profile by name, or a profile file (JSON, as `bench-serve --profile-out`
    writes it)."""
    path = Path(name_or_path)
    if path.suffix == ".json" or path.exists():
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ProfileError(f"cannot read profile {path}: {exc.strerror or exc}") from exc
        return parse_profile(text, where=str(path))
    if name_or_path not in builtin_profiles():
        raise ProfileError(
            f"no profile named {name_or_path!r}: give a profile file, or one of "
            f"{', '.join(builtin_profiles())}"
        )
    text = resources.files(_BUILTIN_PACKAGE).joinpath(f"{name_or_path}.json").read_text("utf-8")
    return parse_profile(text, where=f"built-in profile {name_or_path}")


def parse_profile(text: str, *, where: str = "profile") -> PerfProfile:
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ProfileError(f"{where}: not JSON ({exc})") from exc
    try:
        return PerfProfile.model_validate(document)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(document)'}: {e['msg']}"
            for e in exc.errors()
        )
        raise ProfileError(f"{where}: {problems}") from exc


def dump_profile(profile: PerfProfile) -> str:
    return json.dumps(profile.model_dump(mode="json"), indent=2) + "\n"
