"""A `warmfleet sim run` directory read whole and leniently: `run.json` (what ran),
`rows.jsonl` (one line per request), `events.jsonl` (the fleet's events),
`samples.jsonl` (the router's, the nodes' and the operator's figures every few Mac
minutes) and `summary.json`. Older runs may lack files or fields, and a run stopped
mid-write may end in half a line: both read as less data, never as an error. Only a
directory that is not a run, or a run.json that is not JSON, is refused (RunDirError)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Row = dict[str, Any]


class RunDirError(ValueError):
    """A run directory that is missing or unreadable; the message says which and why."""


@dataclass(frozen=True)
class Run:
    path: Path
    meta: dict[str, Any]  # run.json
    rows: list[Row]
    events: list[Row]
    samples: list[Row]
    summary: dict[str, Any]
    bad_lines: int = 0  # unparseable JSONL lines (a run stopped mid-write leaves one)

    @property
    def label(self) -> str:
        return str(self.meta.get("label") or self.path.name)

    @property
    def day_start(self) -> float | None:
        """The trace's first hour of the day, when the run says it (x axes in hours)."""
        value = (self.meta.get("trace_params") or {}).get("day_start")
        return float(value) if isinstance(value, int | float) else None

    @property
    def day_per_mac(self) -> float:
        """Seconds of the trace's day per Mac second: its compression over the run's
        speed (1 when they are equal, as they should be, or either is unknown). A run at
        half the trace's speed gave the Macs the day's arrivals twice as dense, and its
        Mac hour is two hours of the day."""
        compress = number((self.meta.get("trace_params") or {}).get("compress"))
        speed = number(self.meta.get("speed"))
        if compress is None or speed is None or compress <= 0 or speed <= 0:
            return 1.0
        return compress / speed

    @property
    def speed(self) -> float:
        """Mac seconds per wall second (the fleet's --sim-speed): turns the samples' Mac
        times into the wall time the router's CPU seconds were spent in."""
        for value in (
            self.meta.get("speed"),
            (self.meta.get("trace_params") or {}).get("compress"),
        ):
            if isinstance(value, int | float) and value > 0:
                return float(value)
        return 1.0


def load_run(path: str | Path) -> Run:
    """A run directory read whole; RunDirError when it is not one or run.json is broken."""
    folder = Path(path)
    if not folder.is_dir():
        raise RunDirError(f"{folder}: no such run directory")
    if not (folder / "run.json").is_file() and not (folder / "rows.jsonl").is_file():
        raise RunDirError(f"{folder}: not a run directory (no run.json, no rows.jsonl)")
    meta = _json_file(folder / "run.json")
    summary = _json_file(folder / "summary.json")
    bad = 0
    loaded: dict[str, list[Row]] = {}
    for name in ("rows", "events", "samples"):
        loaded[name], skipped = _jsonl_file(folder / f"{name}.jsonl")
        bad += skipped
    return Run(
        folder,
        meta,
        loaded["rows"],
        sorted(loaded["events"], key=event_time),
        sorted(loaded["samples"], key=lambda s: number(s.get("t")) or 0.0),
        summary,
        bad,
    )


def _json_file(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise RunDirError(f"{path}: unreadable: {exc}") from exc
    if not isinstance(value, dict):
        raise RunDirError(f"{path}: not a JSON object")
    return value


def _jsonl_file(path: Path) -> tuple[list[Row], int]:
    if not path.exists():
        return [], 0
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise RunDirError(f"{path}: unreadable: {exc}") from exc
    rows: list[Row] = []
    bad = 0
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except ValueError:
            bad += 1
            continue
        if isinstance(value, dict):
            rows.append(value)
        else:
            bad += 1
    return rows, bad


def number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def event_time(event: Row) -> float:
    return number(event.get("t")) or 0.0
