"""Daemons of one model send the router their tokenizer's files once: the rest of the
fleet's layout reads leave the files out (`?tokenizer_files=false`) and carry only what
is each daemon's own (its costs). A daemon that changed its layout since its snapshot,
or an older one that ignores the parameter, still ends up with its right layout."""

from __future__ import annotations

import asyncio

import httpx

from support.layouts import tiny_layout
from warmfleet_common.cache_layout import CacheLayout
from warmfleet_common.tiers import TierCosts
from warmfleet_router.backend import Backend, BackendSpec
from warmfleet_router.index import BlockIndex
from warmfleet_router.layout_reads import LayoutReads
from warmfleet_router.sync import BackendSync, SyncOptions

LAYOUT = tiny_layout()
OTHER = tiny_layout(model="other")


def costs(prefill: float) -> TierCosts:
    return TierCosts(
        prefill_us_per_token=prefill, hit_us_per_token={"ram": prefill / 10}, kv_bytes_per_token=64
    )


class Daemons:
    """Fake daemons `d0`, `d1`... each serving `layouts[name]` with its own costs; what
    each was asked for its layout is in `asked`."""

    def __init__(self, layouts: dict[str, CacheLayout], honours_light: bool = True) -> None:
        self.layouts = layouts
        self.honours_light = honours_light
        self.snapshot_fingerprint = {name: layout.fingerprint for name, layout in layouts.items()}
        self.asked: list[tuple[str, str]] = []  # (daemon, "whole" | "light")

    def handler(self, request: httpx.Request) -> httpx.Response:
        name = request.url.host
        if request.url.path == "/v1/cache/snapshot":
            fingerprint = self.snapshot_fingerprint[name]
            return httpx.Response(
                200, json={"epoch": "e", "seq": 0, "fingerprint": fingerprint, "blocks": []}
            )
        if request.url.path == "/v1/cache/layout":
            light = request.url.params.get("tokenizer_files") == "false" and self.honours_light
            self.asked.append((name, "light" if light else "whole"))
            update: dict[str, object] = {"costs": costs(100.0 + int(name[1:]))}
            if light:
                update["tokenizer_files"] = {}
            return httpx.Response(
                200, content=self.layouts[name].model_copy(update=update).model_dump_json()
            )
        return httpx.Response(404)


def resync_all(daemons: Daemons) -> tuple[dict[str, Backend], list[str]]:
    """Every daemon's first resync at once, as a starting fleet's: the backends and the
    fingerprints of the layouts the router was given (in order)."""
    added: list[str] = []
    known: set[str] = set()

    async def add(layout: CacheLayout) -> None:
        assert layout.tokenizer_files, "a layout without its files reached the keyers"
        await asyncio.sleep(0.01)  # a keyer takes a while to build
        added.append(layout.fingerprint)
        known.add(layout.fingerprint)

    async def scenario() -> dict[str, Backend]:
        reads = LayoutReads(known.__contains__)
        backends = {name: Backend(BackendSpec(name, f"http://{name}")) for name in daemons.layouts}
        async with httpx.AsyncClient(transport=httpx.MockTransport(daemons.handler)) as client:
            syncs = [
                BackendSync(b, client, BlockIndex(), add, SyncOptions(), layout_reads=reads)
                for b in backends.values()
            ]
            await asyncio.gather(*(s._resync() for s in syncs))
        return backends

    return asyncio.run(scenario()), added


def test_a_fleet_of_one_model_reads_the_tokenizer_once() -> None:
    daemons = Daemons({f"d{i}": LAYOUT for i in range(6)})
    backends, added = resync_all(daemons)
    assert added == [LAYOUT.fingerprint]
    assert sorted(kind for _, kind in daemons.asked) == ["light"] * 5 + ["whole"]
    for name, backend in backends.items():  # each with its own costs
        assert backend.fingerprint == LAYOUT.fingerprint and backend.model == "m"
        assert backend.costs == costs(100.0 + int(name[1:]))


def test_two_models_are_each_read_whole_once() -> None:
    daemons = Daemons({"d0": LAYOUT, "d1": OTHER, "d2": LAYOUT, "d3": OTHER})
    backends, added = resync_all(daemons)
    assert sorted(added) == sorted([LAYOUT.fingerprint, OTHER.fingerprint])
    assert sorted(kind for _, kind in daemons.asked) == ["light", "light", "whole", "whole"]
    assert [b.model for b in backends.values()] == ["m", "other", "m", "other"]


def test_a_layout_changed_since_the_snapshot_is_read_whole() -> None:
    daemons = Daemons({"d0": LAYOUT, "d1": OTHER})
    daemons.snapshot_fingerprint["d1"] = LAYOUT.fingerprint  # it said LAYOUT, then changed
    backends, added = resync_all(daemons)
    assert sorted(added) == sorted([LAYOUT.fingerprint, OTHER.fingerprint])
    assert backends["d1"].fingerprint == OTHER.fingerprint and backends["d1"].model == "other"


def test_an_older_daemon_that_sends_its_files_anyway_is_served() -> None:
    daemons = Daemons({f"d{i}": LAYOUT for i in range(3)}, honours_light=False)
    backends, added = resync_all(daemons)
    assert added == [LAYOUT.fingerprint]
    assert all(b.fingerprint == LAYOUT.fingerprint for b in backends.values())
