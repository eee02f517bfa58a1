"""Agent-population traces: N developers' Claude Code and Codex sessions over a working
day, compressed in time, with the fleet's events (an agent upgrade, a node lost, nodes
added, a rolling restart).

A trace is JSONL. Its first line is the header: `{"format": "warmfleet-trace/1",
"params": {...}, "seed": S, "chars_per_token": 4.0, "sources": {...}, "summary": {...}}`
(`sources` says where every number comes from: measured here, published, or an
assumption that is a parameter; see `population`). Then one record per line, in time
order. A request record is compact: it holds what rebuilds the request, not its body
(`bodies.materialize` rebuilds it, byte for byte, from the records before it):

    {"t": 12.345, "gap": 0.04, "dev": 7, "agent": "claude-code", "version": "2.1.332",
     "session": "<uuid>", "turn": 3, "kind": "tool", "results": [812, 95], "out": 252,
     "calls": 1}

- `t`: seconds since the trace's start, compressed (the day's seconds / `compress`),
  open-loop: as if each earlier response of the session took `ttft_s + out /
  decode_tokens_per_s`. `gap`: the compressed wait between the end of the session's
  previous response and this request (a tool's run or the developer's think time), for
  a closed-loop replay.
- `turn`: the step's index in its session (0: the first request). `kind`: `user` (the
  developer's words, `user` tokens; turn 0 is the CLI's first request), `tool` (the
  results of the previous step's `calls` tool calls, `results` tokens each), `compact`
  (the CLI summarises the conversation: it and a fixed instruction; `out` is the
  summary), `resume` (the first request after a compaction: the static head, the
  summary and the developer's `user` tokens).
- `out`: the tokens the response generates (the request's `max_tokens` /
  `max_output_tokens`); `calls`: the tool calls it makes (0: it ends the request).
  `end: true` on a session's last step.

Event records: `{"t", "event": "agent-upgrade", "agent", "from", "to"}` (sessions
started from then on use the new version: another system prompt and tool list),
`{"t", "event": "node-lost", "node": I}`, `{"t", "event": "nodes-added", "count": N}`,
`{"t", "event": "rolling-restart"}`.

Deterministic: the same parameters give a byte-identical file; each developer's
sessions come from a generator seeded by (seed, developer), so adding developers leaves
the others' sessions as they were.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

from warmfleet_cli.sim import population as pop
from warmfleet_cli.sim.text import key_int, stable_uuid

FORMAT = "warmfleet-trace/1"
Record = dict[str, Any]


@dataclass(frozen=True)
class TraceParams:
    """Everything a trace is generated from (hours are of the day: 10.5 is 10:30)."""

    developers: int = 20
    seed: int = 0
    day_start: float = 9.0
    day_end: float = 17.0
    compress: float = 24.0  # real seconds per trace second: 8 hours in 20 minutes
    claude_share: float = pop.CLAUDE_SHARE[0]
    sessions_per_day: float = pop.SESSIONS_PER_DAY[0]
    context_tokens: int = 65_536
    compact_at: float = pop.COMPACTION["compact_at"][0]
    claude_memory: bool = False
    date: str = "2026-12-07"
    upgrades: tuple[tuple[str, float], ...] = (("claude-code", 12.0),)
    node_lost: tuple[float, int] | None = (10.5, 0)  # (hour, node index)
    nodes_added: tuple[float, int] | None = (14.0, 2)  # (hour, count)
    rolling_restart: float | None = 16.0
    ttft_s: float = pop.SERVICE_TIME["ttft_s"][0]
    decode_tokens_per_s: float = pop.SERVICE_TIME["decode_tokens_per_s"][0]

    def check(self) -> None:
        """ValueError naming the first parameter out of range."""
        if self.developers < 1:
            raise ValueError("developers must be >= 1")
        if not 0 <= self.day_start < self.day_end <= 24:
            raise ValueError("the working day must be within 0-24 h and end after it starts")
        if self.compress <= 0:
            raise ValueError("compress must be > 0")
        if not 0 <= self.claude_share <= 1:
            raise ValueError("claude_share must be within 0-1")
        if self.sessions_per_day < 0:
            raise ValueError("sessions_per_day must be >= 0")
        if not 0 < self.compact_at < 1:
            raise ValueError("compact_at must be within 0-1 (a share of context_tokens)")
        first = max(_first_request_tokens(s) for s in pop.AGENTS.values())
        if self.context_tokens * (1 - self.compact_at) < 4_096:
            raise ValueError("context_tokens x (1 - compact_at) must be >= 4,096 tokens")
        if self.context_tokens * self.compact_at < first + 4_096:
            raise ValueError(
                f"context_tokens x compact_at must leave room for a session: the first "
                f"requests alone are ~{first:,} tokens"
            )
        for agent, _ in self.upgrades:
            if agent not in pop.AGENTS:
                raise ValueError(f"no agent {agent!r} to upgrade (claude-code, codex)")
        for name, hour in self.event_hours():
            if not self.day_start <= hour < self.day_end:
                raise ValueError(
                    f"{name} at {_clock(hour)} is outside the working day "
                    f"({_clock(self.day_start)}-{_clock(self.day_end)})"
                )
        if self.ttft_s < 0 or self.decode_tokens_per_s <= 0:
            raise ValueError("ttft_s must be >= 0 and decode_tokens_per_s > 0")

    def event_hours(self) -> list[tuple[str, float]]:
        """Each fleet event's name and hour of the day."""
        named = [(f"the {agent} upgrade", hour) for agent, hour in self.upgrades]
        if self.node_lost is not None:
            named.append(("the node lost", self.node_lost[0]))
        if self.nodes_added is not None:
            named.append(("the nodes added", self.nodes_added[0]))
        if self.rolling_restart is not None:
            named.append(("the rolling restart", self.rolling_restart))
        return named


def _clock(hour: float) -> str:
    minutes = round(hour * 60)
    return f"{minutes // 60:02d}:{minutes % 60:02d}"


@dataclass
class Trace:
    header: dict[str, Any]
    records: list[Record] = field(default_factory=list)


def sources(params: TraceParams) -> dict[str, str]:
    """Where each number of a trace comes from."""
    out = {
        "chars_per_token": "measured here: 3.8-4.5 characters per token on the real CLIs' "
        "first requests (docs/PERFORMANCE.md); sizes are tokens, text is 4 characters each",
        "claude_share": pop.CLAUDE_SHARE[1],
        "sessions_per_day": pop.SESSIONS_PER_DAY[1],
        "session_starts": pop.SESSION_STARTS,
        "requests_per_session": pop.REQUESTS_PER_SESSION.source,
        "tool_steps_per_request": pop.TOOL_STEPS_PER_REQUEST.source,
        "tool_calls_per_step": pop.TOOL_CALLS_PER_STEP.source,
        "user_tokens": pop.USER_TOKENS.source,
        "human_wait_s": pop.HUMAN_WAIT_S.source,
        "tool_wait_s": pop.TOOL_WAIT_S.source,
        "context_tokens": "assumption: the context the fleet serves agents with (a parameter)",
        "tool_results": "a tool step's results: its appended tokens less the previous "
        "step's output (which the request also carries), split over its calls",
        "events": "parameters: the times of the upgrade, the node lost, the nodes added and "
        "the rolling restart",
        "day": "parameters: working hours; steps after the day's end are dropped (the "
        "developers go home)",
    }
    for name, (_, source) in pop.COMPACTION.items():
        out[f"compaction.{name}"] = source
    for name, (_, source) in pop.SERVICE_TIME.items():
        out[name] = source
    for shape in pop.AGENTS.values():
        out[f"{shape.name}.appended"] = shape.appended.source
        out[f"{shape.name}.output"] = shape.output.source
        for name, source in shape.sources.items():
            out[f"{shape.name}.{name}"] = source
    return out


def _first_request_tokens(shape: pop.AgentShape) -> int:
    reminder = round(shape.reminder_chars / pop.CHARS_PER_TOKEN)
    return shape.system_tokens + shape.tools_tokens + shape.environment_tokens + reminder


def _poisson(rng: random.Random, mean: float) -> int:
    """Knuth's method (means of a few sessions a day)."""
    limit, k, p = math.exp(-mean), 0, 1.0
    while True:
        p *= rng.random()
        if p <= limit:
            return k
        k += 1


class _Session:
    """One session's steps, in real seconds from the day's start."""

    def __init__(
        self, params: TraceParams, rng: random.Random, dev: int, index: int, agent: str
    ) -> None:
        self.params, self.rng, self.dev = params, rng, dev
        self.shape = pop.AGENTS[agent]
        self.id = stable_uuid(params.seed, dev, index, agent)
        self.steps: list[Record] = []
        self.base = _first_request_tokens(self.shape)
        self.context = 0  # tokens of the last request plus its output

    def sample(self, q: pop.Quantiles) -> float:
        return q.sample(self.rng.random())

    def run(self, start: float, version: str, end: float) -> list[Record]:
        p, shape = self.params, self.shape
        limit = int(p.context_tokens * p.compact_at)
        headroom = p.context_tokens - limit
        requests = round(self.sample(pop.REQUESTS_PER_SESSION))
        now, gap = start, 0.0
        for request in range(requests):
            tools = round(self.sample(pop.TOOL_STEPS_PER_REQUEST))
            for step in range(tools + 1):
                if request or step:
                    wait = pop.HUMAN_WAIT_S if step == 0 else pop.TOOL_WAIT_S
                    gap = self.sample(wait)
                    now += self._service(self.steps[-1]["out"]) + gap
                if now >= end:
                    return self._ended()
                out = min(round(self.sample(shape.output)), headroom // 2)
                calls = round(self.sample(pop.TOOL_CALLS_PER_STEP)) if step < tools else 0
                record: Record = {"t": now, "gap": gap, "dev": self.dev, "agent": shape.name}
                record |= {"version": version, "session": self.id, "turn": len(self.steps)}
                if step == 0:
                    words = max(1, round(self.sample(pop.USER_TOKENS)))
                    added = words + (self.base if request == 0 else 0)
                    body: Record = {"kind": "user", "user": words}
                else:
                    body = {"kind": "tool", "results": self._results(headroom // 2)}
                    added = sum(body["results"])
                if self.steps and self.context + added + out > limit:
                    now = self._compact(now, end)
                    if now >= end:
                        return self._ended()
                    words = body.get("user", 0)
                    body, added = {"kind": "resume", "user": words}, self.base + words
                    record |= {"t": now, "gap": 0.0, "turn": len(self.steps)}
                record |= body
                record |= {"out": out, "calls": calls}
                fresh = record["turn"] == 0 or body["kind"] == "resume"
                self.context = (0 if fresh else self.context) + added + out
                self.steps.append(record)
        return self._ended()

    def _service(self, out: float) -> float:
        return self.params.ttft_s + out / self.params.decode_tokens_per_s

    def _results(self, cap: int) -> list[int]:
        """Each tool result of this step: the step's appended tokens (TraceLab counts
        the previous output in them) less the previous output, split over the calls."""
        previous = self.steps[-1]
        calls = max(1, previous["calls"])
        appended = round(self.sample(self.shape.appended))
        total = max(16 * calls, appended - previous["out"])
        total = min(total, cap, self.shape.tool_result_cap_tokens * calls)
        weights = [0.2 + self.rng.random() for _ in range(calls)]
        return [max(16, round(total * w / sum(weights))) for w in weights]

    def _compact(self, now: float, end: float) -> float:
        """A compaction step before the next one; returns when the next one starts."""
        previous = self.steps[-1]
        now += self._service(previous["out"])
        if now >= end:
            return now
        summary = int(pop.COMPACTION["summary_tokens"][0])
        record = {k: previous[k] for k in ("dev", "agent", "version", "session")}
        record = {"t": now, "gap": 0.0, **record, "turn": len(self.steps), "kind": "compact"}
        record |= {"out": summary, "calls": 0}
        self.steps.append(record)
        return now + self._service(summary)

    def _ended(self) -> list[Record]:
        if self.steps:
            self.steps[-1]["end"] = True
        return self.steps


def _developer(params: TraceParams, dev: int, versions: list[tuple[float, str, str]]) -> Any:
    """A developer's requests over the day (real seconds from its start)."""
    rng = random.Random(key_int("developer", params.seed, dev))
    agent = "claude-code" if rng.random() < params.claude_share else "codex"
    length = (params.day_end - params.day_start) * 3600
    starts = sorted(rng.random() * length for _ in range(_poisson(rng, params.sessions_per_day)))
    for index, start in enumerate(starts):
        version = pop.AGENTS[agent].version
        for at, upgraded_agent, to in versions:
            if upgraded_agent == agent and start >= at:
                version = to
        yield from _Session(params, rng, dev, index, agent).run(start, version, length)


def generate(params: TraceParams) -> Trace:
    """The trace of `params`, records in time order."""
    params.check()

    def at(hour: float) -> float:
        """An hour of the day in (uncompressed) seconds from the day's start."""
        return (hour - params.day_start) * 3600

    versions = sorted(
        (at(hour), agent, pop.AGENTS[agent].upgraded) for agent, hour in params.upgrades
    )
    events: list[Record] = [
        {"t": t, "event": "agent-upgrade", "agent": a, "from": pop.AGENTS[a].version, "to": v}
        for t, a, v in versions
    ]
    if params.node_lost is not None:
        events.append(
            {"t": at(params.node_lost[0]), "event": "node-lost", "node": params.node_lost[1]}
        )
    if params.nodes_added is not None:
        events.append(
            {"t": at(params.nodes_added[0]), "event": "nodes-added", "count": params.nodes_added[1]}
        )
    if params.rolling_restart is not None:
        events.append({"t": at(params.rolling_restart), "event": "rolling-restart"})
    requests = [r for dev in range(params.developers) for r in _developer(params, dev, versions)]
    for record in [*events, *requests]:
        record["t"] = round(record["t"] / params.compress, 3)
        if "gap" in record:
            record["gap"] = round(record["gap"] / params.compress, 3)
    records = sorted(
        [*events, *requests],
        key=lambda r: (
            r["t"],
            "event" not in r,
            r.get("dev", -1),
            r.get("session", ""),
            r.get("turn", 0),
        ),
    )
    sessions = {r["session"] for r in requests}
    header = {
        "format": FORMAT,
        "generator": "warmfleet sim trace",
        "seed": params.seed,
        "params": {**asdict(params), "upgrades": [list(u) for u in params.upgrades]},
        "chars_per_token": pop.CHARS_PER_TOKEN,
        "agents": {s.name: {"versions": [s.version, s.upgraded]} for s in pop.AGENTS.values()},
        "summary": {
            "developers": params.developers,
            "sessions": len(sessions),
            "requests": len(requests),
            "first_requests": sum(1 for r in requests if r["turn"] == 0),
            "compactions": sum(1 for r in requests if r["kind"] == "compact"),
            "duration_s": round((params.day_end - params.day_start) * 3600 / params.compress, 3),
        },
        "sources": sources(params),
    }
    return Trace(header, records)


def dump(trace: Trace, out: IO[str]) -> None:
    for item in (trace.header, *trace.records):
        out.write(json.dumps(item, separators=(",", ":"), ensure_ascii=False) + "\n")


def write(trace: Trace, path: str | Path) -> None:
    with open(path, "w", encoding="utf-8") as out:
        dump(trace, out)


def read(path: str | Path) -> tuple[dict[str, Any], Iterator[Record]]:
    """A trace file's header and its records (read lazily)."""
    handle = open(path, encoding="utf-8")  # noqa: SIM115 -- closed by the records' iterator
    first = handle.readline()
    try:
        header = json.loads(first)
    except json.JSONDecodeError as exc:
        handle.close()
        raise ValueError(f"{path}: not a trace (line 1: {exc.msg})") from exc
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        handle.close()
        raise ValueError(f"{path}: not a {FORMAT} trace (its first line has no such format)")

    def records() -> Iterator[Record]:
        with handle:
            for line in handle:
                if line.strip():
                    yield json.loads(line)

    return header, records()


def sessions(records: Iterable[Record]) -> dict[str, list[Record]]:
    """Request records grouped by session, each in turn order."""
    out: dict[str, list[Record]] = {}
    for record in records:
        if "session" in record:
            out.setdefault(record["session"], []).append(record)
    return out
