"""The router's status as `/v1/router/status` shows it: a summary of counts for anyone,
and with the admin token the detail (each backend's health, index and costs, the
session table, recent decisions and drain handoffs, newest first)."""

from __future__ import annotations

from typing import Any

from warmfleet_router.fleet import Fleet


def status_summary(fleet: Fleet) -> dict[str, Any]:
    """The status without the admin token: counts only."""
    backends = list(fleet.members.backends.values())
    return {
        "policy": fleet.options.policy,
        "backends": len(backends),
        "ready_backends": sum(b.usable for b in backends),
        "in_flight": sum(b.in_flight for b in backends),
        "index_blocks": sum(fleet.index.size(b.name) for b in backends),
        "sessions": len(fleet.planner.sessions),
        "decisions": len(fleet.planner.decisions),
    }


def status_detail(fleet: Fleet) -> dict[str, Any]:
    index, sessions = fleet.index, fleet.planner.sessions
    return {
        "policy": fleet.options.policy,
        "epsilon": fleet.options.epsilon,
        "index": {
            "estimated_bytes": index.estimated_bytes(),
            "budget_bytes": index.budget_bytes,
        },
        "sessions_table": {
            "bytes": sessions.size_bytes,
            "budget_bytes": sessions.budget_bytes,
            "forgotten": sessions.forgotten,
        },
        "backends": [
            {
                "name": b.name,
                "url": b.url,
                "labels": b.spec.labels,
                "health": b.health,
                "health_detail": b.health_detail,
                "in_flight": b.in_flight,
                "requests": b.requests,
                "failures": b.failures,
                "index": {
                    "mode": b.index_mode,
                    "blocks": index.size(b.name),
                    "epoch": b.epoch,
                    "seq": b.seq,
                    "resyncs": b.resyncs,
                    "layout": b.fingerprint,
                    "dropped_for_budget": index.dropped_blocks(b.name),
                },
                "models": sorted(b.models) if b.models is not None else None,
                "context_length": b.context_length,
                "tier_costs": b.costs.model_dump() if b.costs is not None else None,
                "warm_sets": b.warm_sets,
                "last_error": b.last_error,
                "problems": dict(b.problems),
            }
            for b in sorted(fleet.members.backends.values(), key=lambda b: b.name)
        ],
        "sessions": len(sessions),
        "decisions": list(fleet.planner.decisions)[::-1],
        "handoffs": list(fleet.drain.handoffs)[::-1],
    }
