"""`warmfleet plan`: how many Macs for how many developers. One trace of the developers'
Claude Code and Codex sessions (the busy hours of a day, no fleet events), replayed on
simulated fleets of a profiled Mac (`warmfleet sim run`), a fleet size at a time: sizes
doubled until one keeps first-request TTFT p95 under the target, then bisected down to
the smallest that does. It assumes that more Macs never serve first requests slower,
which holds up to the simulation's noise: the table shows every size it ran.

A size is decided only from runs this machine kept up with (`valid`); one it did not is
the end of the plan, with the advice to lower --compress.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from warmfleet_cli.sim.run import RunOptions, run
from warmfleet_cli.sim.trace import TraceParams, generate, write


@dataclass(frozen=True)
class PlanOptions:
    profile: str
    developers: int
    target_p95_s: float  # first-request TTFT, the profiled Mac's seconds
    out: Path
    trace: TraceParams = field(default_factory=TraceParams)
    min_nodes: int = 1
    max_nodes: int = 256
    policy: str = "prefix"
    warm: bool = True
    port: int = 8000
    sim_per_process: int = 50
    cache_memory_mb: int | None = None


@dataclass(frozen=True)
class Trial:
    """One fleet size's run."""

    nodes: int
    requests: int
    failed: int
    first_p50_s: float | None
    first_p95_s: float | None
    later_p95_s: float | None
    token_hit_rate: float | None
    first_hit_rate: float | None
    valid: bool
    invalid_reason: str | None
    run_dir: str

    def meets(self, target_s: float) -> bool:
        return (
            self.valid
            and self.failed == 0
            and self.first_p95_s is not None
            and self.first_p95_s <= target_s
        )


@dataclass(frozen=True)
class Plan:
    nodes: int | None  # the smallest size that met the target; None: none did
    trials: list[Trial]  # in the order they ran
    reason: str  # what was decided, or why nothing was


Evaluate = Callable[[int], Trial]


def search(evaluate: Evaluate, target_s: float, low: int, high: int) -> Plan:
    """The smallest size in [low, high] whose trial meets `target_s`: sizes doubled from
    `low` until one does, then bisected between it and the last that did not."""
    trials: list[Trial] = []

    def trial(nodes: int) -> Trial:
        done = evaluate(nodes)
        trials.append(done)
        return done

    failing, passing = low - 1, None
    size = low
    while True:
        done = trial(size)
        if not done.valid:
            return Plan(None, trials, _invalid(done))
        if done.meets(target_s):
            passing = size
            break
        failing = size
        if size >= high:
            return Plan(None, trials, f"even {high} Macs miss the target: raise --max-nodes")
        size = min(high, size * 2)
    while passing - failing > 1:
        middle = (failing + passing) // 2
        done = trial(middle)
        if not done.valid:
            return Plan(None, trials, _invalid(done))
        if done.meets(target_s):
            passing = middle
        else:
            failing = middle
    return Plan(passing, trials, f"{passing} Macs: the smallest fleet that met the target")


def plan(options: PlanOptions, say: Callable[[str], None]) -> Plan:
    """Writes the trace, runs the search, and writes DIR/plan.json."""
    options.out.mkdir(parents=True, exist_ok=True)
    params = replace(
        options.trace,
        developers=options.developers,
        upgrades=(),
        node_lost=None,
        nodes_added=None,
        rolling_restart=None,
    )
    trace_path = options.out / "trace.jsonl"
    write(generate(params), trace_path)

    def evaluate(nodes: int) -> Trial:
        say(f"{nodes} Macs: replaying the trace")
        run_dir = options.out / f"nodes-{nodes}"
        meta = run(
            RunOptions(
                trace=trace_path,
                out=run_dir,
                profile=options.profile,
                nodes=nodes,
                policy=options.policy,
                warm=options.warm,
                port=options.port,
                sim_per_process=options.sim_per_process,
                cache_memory_mb=options.cache_memory_mb,
                report=False,
            ),
            lambda line: say(f"  {line}"),
        )
        result = json.loads((run_dir / "summary.json").read_text())
        done = trial_of(nodes, result, meta, str(run_dir))
        say(f"{nodes} Macs: first-request TTFT p95 {_seconds(done.first_p95_s)}"
            f"{'' if done.valid else ' (invalid run)'}")  # fmt: skip
        return done

    decided = search(evaluate, options.target_p95_s, options.min_nodes, options.max_nodes)
    (options.out / "plan.json").write_text(
        json.dumps(
            {
                "profile": options.profile,
                "developers": options.developers,
                "target_first_request_ttft_p95_s": options.target_p95_s,
                "policy": options.policy,
                "warm_sets": options.warm,
                "trace": asdict(params),
                "nodes": decided.nodes,
                "reason": decided.reason,
                "trials": [asdict(t) for t in decided.trials],
            },
            indent=1,
        )
        + "\n"
    )
    return decided


def trial_of(nodes: int, result: dict[str, Any], meta: dict[str, Any], run_dir: str) -> Trial:
    first, later = result["first_request_ttft_s"], result["later_ttft_s"]
    return Trial(
        nodes=nodes,
        requests=int(result["requests"]),
        failed=int(result["failed"]),
        first_p50_s=first.get("p50"),
        first_p95_s=first.get("p95"),
        later_p95_s=later.get("p95"),
        token_hit_rate=result.get("token_hit_rate"),
        first_hit_rate=result.get("first_request_hit_rate"),
        valid=bool(meta.get("valid", False)),
        invalid_reason=meta.get("invalid_reason"),
        run_dir=run_dir,
    )


def table(decided: Plan, target_s: float) -> str:
    """The trials as a Markdown table, by fleet size."""
    lines = [
        "| Macs | requests | failed | first-request TTFT p50 | p95 | later p95 "
        "| token hit rate | first-request hit rate | valid | meets |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for t in sorted(decided.trials, key=lambda t: t.nodes):
        lines.append(
            f"| {t.nodes} | {t.requests:,} | {t.failed} | {_seconds(t.first_p50_s)} "
            f"| {_seconds(t.first_p95_s)} | {_seconds(t.later_p95_s)} | {_share(t.token_hit_rate)} "
            f"| {_share(t.first_hit_rate)} | {'yes' if t.valid else 'no'} "
            f"| {'yes' if t.meets(target_s) else 'no'} |"
        )
    return "\n".join(lines)


def _invalid(trial: Trial) -> str:
    return (
        f"the run of {trial.nodes} Macs cannot be trusted ({trial.invalid_reason}): "
        "lower --compress and plan again"
    )


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"
