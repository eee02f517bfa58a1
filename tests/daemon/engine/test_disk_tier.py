"""The disk tier under a real engine (tiny model): a block evicted from RAM comes back
from disk token for token as computed from scratch, also in a new engine over the same
directory (a restart: the index is rebuilt from headers); corrupt, truncated, mismatched
and missing files are misses that are prefilled; a full or read-only disk turns the tier
off and the engine keeps serving from RAM."""

from __future__ import annotations

import asyncio
import logging
import os
import random
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from support.engine import request, run, tokens_of
from warmfleet_common.prompts import RenderedPrompt
from warmfleet_common.wire import event_line, parse_event_line
from warmfleet_daemon.cache.events import CacheEventLog
from warmfleet_daemon.engine.core import Engine
from warmfleet_daemon.engine.requests import Usage
from warmfleet_daemon.kvtransfer.codec import BlockCodec, probe_layout
from warmfleet_daemon.kvtransfer.disk_tier import DiskTier
from warmfleet_daemon.models.loader import LoadedModel

VOCAB = (100, 49000)
BLOCK = 16


def prompt(seed: int, length: int = 100) -> RenderedPrompt:
    rng = random.Random(seed)
    return RenderedPrompt(tuple(rng.randrange(*VOCAB) for _ in range(length)), (40,))


def ask(engine: Engine, p: RenderedPrompt) -> tuple[list[int], Usage]:
    events = run(engine, request(p.tokens, p.cuts))[0]
    assert events[-1].usage is not None
    return tokens_of(events), events[-1].usage


class Setup:
    """An engine whose RAM holds about one prompt, over a disk tier in `directory`."""

    def __init__(self, loaded: LoadedModel, make_engine, directory: Path, fingerprint="fp"):
        probe = make_engine(loaded, block_size=BLOCK)
        per_prompt = probe.block_bytes(100)
        self.engine: Engine = make_engine(loaded, block_size=BLOCK, budget=int(per_prompt * 1.3))
        self.codec = BlockCodec(fingerprint, probe_layout(loaded.model))
        self.disk = DiskTier(directory, self.codec, 1 << 30, self.engine.cache)
        self.engine.attach_tier(self.disk)

    def close(self) -> None:
        self.disk.stop()


@pytest.fixture
def setup(tiny, make_engine, tmp_path) -> Iterator[Setup]:
    s = Setup(tiny, make_engine, tmp_path)
    yield s
    s.close()


def cold(loaded: LoadedModel, make_engine, p: RenderedPrompt) -> list[int]:
    return ask(make_engine(loaded, block_size=BLOCK), p)[0]


def evict(setup: Setup, p: RenderedPrompt) -> int:
    """Push `p`'s later blocks out of RAM (another prompt takes the room; its first
    blocks stay); the tokens RAM still holds."""
    ask(setup.engine, prompt(999))
    assert setup.disk.flush()
    held = setup.engine.cache.match(setup.engine.plan(p)).tokens
    assert held < 60
    return held


def test_evicted_blocks_come_back_from_disk_like_scratch(tiny, make_engine, setup) -> None:
    a = prompt(1)
    expected = cold(tiny, make_engine, a)
    first, usage = ask(setup.engine, a)
    assert first == expected and usage.cached_tokens == 0
    in_ram = evict(setup, a)
    again, usage = ask(setup.engine, a)
    assert again == expected
    # RAM's blocks, then the disk's: all of them, the last too (with its logits it is
    # larger than this small RAM budget: it went to disk at once, and came back held for
    # this prompt alone).
    assert usage.cached_tokens == 100 and usage.cached["disk"] == 100 - in_ram
    stats = setup.disk.stats()
    assert stats.state == "on" and stats.read_blocks == 4 and stats.dropped_blocks == 0


def test_blocks_read_back_that_ram_evicts_before_the_prompt_takes_them_are_still_its(
    tiny, make_engine, setup, monkeypatch
) -> None:
    """RAM may evict a block read back from disk before the engine takes it (a full RAM,
    other prompts' blocks): the prompt keeps what its read gave it and computes nothing."""
    a = prompt(3)
    expected = cold(tiny, make_engine, a)
    ask(setup.engine, a)
    in_ram = evict(setup, a)
    cache = setup.engine.cache
    insert = cache.insert

    def insert_then_evict(chunk, parent, payload, nbytes, source=None):  # type: ignore[no-untyped-def]
        outcome = insert(chunk, parent, payload, nbytes, source=source)
        if source == "disk":
            cache.drop([chunk.key])  # gone from RAM before the engine looks
        return outcome

    monkeypatch.setattr(cache, "insert", insert_then_evict)
    again, usage = ask(setup.engine, a)
    assert again == expected
    assert usage.cached_tokens == 100 and usage.cached["disk"] == 100 - in_ram


def test_a_restart_resumes_from_disk(tiny, make_engine, tmp_path) -> None:
    a = prompt(2)
    expected = cold(tiny, make_engine, a)
    before = Setup(tiny, make_engine, tmp_path)
    ask(before.engine, a)
    assert before.disk.save_all()
    before.close()

    after = Setup(tiny, make_engine, tmp_path)  # a new process: the index from headers
    try:
        assert after.disk.stats().blocks == 7
        again, usage = ask(after.engine, a)
        assert again == expected and usage.cached["disk"] == usage.cached_tokens == 100
    finally:
        after.close()


@pytest.mark.parametrize("damage", ["corrupt", "truncated", "fingerprint", "missing"])
def test_a_bad_file_is_a_miss_and_prefilled(
    tiny, make_engine, tmp_path, caplog, damage: str
) -> None:
    a = prompt(3)
    expected = cold(tiny, make_engine, a)
    if damage == "fingerprint":  # written by a daemon of other weights
        other = Setup(tiny, make_engine, tmp_path, fingerprint="fp")
        ask(other.engine, a)
        assert other.disk.save_all()
        other.close()
        os.rename(tmp_path / "fp", tmp_path / "fp2")
        s = Setup(tiny, make_engine, tmp_path, fingerprint="fp2")
        assert s.disk.stats().blocks == 0  # known at start: headers name another one
    else:
        s = Setup(tiny, make_engine, tmp_path)
        ask(s.engine, a)
        in_ram = evict(s, a)
    try:
        chunks = s.engine.plan(a)
        victim = s.disk.directory / f"{chunks[3].key.hex()}.safetensors"
        if damage == "corrupt":
            data = bytearray(victim.read_bytes())
            data[-100] ^= 0xFF
            victim.write_bytes(bytes(data))
        elif damage == "truncated":
            victim.write_bytes(victim.read_bytes()[:-1000])
        elif damage == "missing":
            victim.unlink()
        with caplog.at_level(logging.WARNING):
            again, usage = ask(s.engine, a)
        assert again == expected
        if damage == "fingerprint":
            assert usage.cached["disk"] == 0
        else:
            assert usage.cached_tokens == chunks[2].end  # up to the bad block
            assert usage.cached["disk"] == chunks[2].end - in_ram
            assert s.disk.stats().ignored_files == 1
            assert sum("Ignoring disk-tier block" in r.message for r in caplog.records) == 1
    finally:
        s.close()


def mount_tmpfs(path: Path, options: str) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True
    )
    return done.returncode == 0


@pytest.mark.parametrize("kind", ["full", "read-only"])
def test_a_full_or_read_only_disk_turns_the_tier_off_and_serving_goes_on(
    tiny, make_engine, tmp_path, caplog, kind: str
) -> None:
    where = tmp_path / "disk"
    options = "size=64k" if kind == "full" else "ro,size=1m"
    if not mount_tmpfs(where, options):
        pytest.skip("mounting a tmpfs needs root (CI and the dev machines are)")
    try:
        a = prompt(4)
        expected = cold(tiny, make_engine, a)
        with caplog.at_level(logging.ERROR):
            s = Setup(tiny, make_engine, where)
            try:
                first, _ = ask(s.engine, a)
                s.disk.flush()
                evict(s, a)
                again, usage = ask(s.engine, a)
                stats = s.disk.stats()
            finally:
                s.close()
        assert first == again == expected and usage.cached["disk"] == 0
        assert stats.state == "off" and stats.error
        assert ("bytes free" in stats.error) if kind == "full" else ("Read-only" in stats.error)
        assert stats.dropped_blocks > 0
        assert sum("disk tier is off" in r.message for r in caplog.records) == 1
    finally:
        subprocess.run(["umount", str(where)], check=False)


def test_a_chain_whose_parent_left_ram_meanwhile_goes_on_on_disk(tiny, make_engine, setup) -> None:
    """An idle prefill that waited while another prompt pushed its first blocks out of
    RAM stores its later blocks on disk, where the next request finds the whole chain."""
    a = prompt(5, 100)
    expected = cold(tiny, make_engine, a)
    e = setup.engine
    ask(e, RenderedPrompt(a.tokens[:40], ()))  # the conversation so far: in RAM
    done: list = []
    e.submit(request(a.tokens[:88], (40,), prefill_only=True, idle=True), done.append)
    e.step()  # restores the first blocks, computes one chunk
    ask(e, prompt(998, 130))  # a real request meanwhile: RAM now holds it instead
    e.run_until_idle()  # the idle prefill's remaining chunks
    assert done[-1].finish_reason == "prefilled"
    assert setup.disk.flush()
    again, usage = ask(e, a)
    assert again == expected and usage.cached_tokens == 88


def test_events_and_the_disk_tiers_held_blocks_say_which_tier_holds_a_block(
    tiny, make_engine, setup
) -> None:
    """The cache event log follows the disk tier through its own `tier_listener` (as the
    assembly wires it); the snapshot built from `held()` is tested over HTTP behind a
    router in tests/router/test_disk_tier_routing.py."""
    events = CacheEventLog[Any](lambda payload: payload.logits is not None)
    setup.engine.cache.listeners.append(events.record)
    setup.disk.listeners.append(events.tier_listener(setup.disk.name))
    a = prompt(6)
    ask(setup.engine, a)
    evict(setup, a)
    backlog, subscription = events.subscribe(0, asyncio.new_event_loop())  # type: ignore[misc]
    lines = [parse_event_line(event_line(e.as_wire())) for e in backlog]
    keys = {c.key.hex() for c in setup.engine.plan(a)}
    mine = [(e.type, e.tier) for e in lines if getattr(e, "key", None) in keys]
    # Each of a's blocks reached the disk (written behind; the last, with its logits too
    # large for this RAM, only there); some left RAM later, none left the disk.
    assert mine.count(("stored", "disk")) == len(keys)
    assert ("evicted", "ram") in mine and ("evicted", "disk") not in mine
    assert {bytes.fromhex(k) for k in keys} <= {e.key for e in setup.disk.held()}
    events.unsubscribe(subscription)
