"""The router's state, wired: the block index and the key workers that every part shares,
then membership (the backends and their sync tasks, `membership`), request planning and
in-flight accounting (`planning`), the drain handoff (`drain`), with the hot sessions
and the session digest the last two share, and the warm prompts learned from the
requests' static heads (`learning`). Each part is used directly (`fleet.members`,
`fleet.planner`, `fleet.drain`); this holds them and closes them in order."""

from __future__ import annotations

import httpx

from warmfleet_common.watched import WatchedFile
from warmfleet_router.drain import DrainHandoffs
from warmfleet_router.handoff import HotSessions
from warmfleet_router.index import BlockIndex
from warmfleet_router.learning import LearnedTable
from warmfleet_router.membership import Membership
from warmfleet_router.metrics import RouterMetrics
from warmfleet_router.options import RouterOptions
from warmfleet_router.planning import Planner
from warmfleet_router.quotas import QuotaConfig, Quotas, parse_quotas
from warmfleet_router.sessions import SessionDigest
from warmfleet_router.workers import KeyingPool


class Fleet:
    def __init__(
        self,
        options: RouterOptions,
        client: httpx.AsyncClient,
        metrics: RouterMetrics,
        pool: KeyingPool | None = None,
    ) -> None:
        self.options = options
        self.client = client
        self.metrics = metrics
        self.index = BlockIndex(budget_bytes=options.index_budget_bytes)
        self.pool = pool if pool is not None else KeyingPool(options.key_workers)
        hot, digest = HotSessions(), SessionDigest()
        self.members = Membership(options, client, metrics, self.index, self.pool)
        self.planner = Planner(options, self.members, metrics, hot, digest)
        self.drain = DrainHandoffs(
            options, client, metrics, self.members, self.planner, hot, digest
        )
        self.members.departures = self.drain  # a backend leaving hands its sessions off
        limits = (
            WatchedFile(options.quotas_file, parse_quotas, "quotas").current
            if options.quotas_file
            else QuotaConfig
        )
        self.quotas = Quotas(limits)
        self.learned = LearnedTable(options.learn)  # the static heads sessions share
        metrics.observe_learned(self.learned.counts)
        metrics.observe_tenants(self.quotas.in_flight)
        metrics.observe(
            lambda: list(self.members.backends.values()),
            self.index.size,
            self.index.estimated_bytes,
        )

    async def close(self) -> None:
        self.drain.close()
        await self.members.close()
        await self.pool.close()
