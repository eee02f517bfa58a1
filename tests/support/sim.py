"""Simulated daemons in tests: a profile file of made-up, round figures."""

from __future__ import annotations

import random
import socket
from pathlib import Path

from warmfleet_common.perf_profile import PerfProfile, RatePoint, dump_profile


def write_profile(path: Path, context_length: int = 8192, memory_gib: int = 2) -> Path:
    """A profile of made-up, round figures: KV of 128 KiB a token, so 2 GiB of cache
    holds 16,384 tokens (a test fills it quickly: sessions of 10k tokens need more)."""
    profile = PerfProfile(
        name="test-mac",
        machine="a Mac in a test",
        model="test-7b",
        source="made up for the tests",
        context_length=context_length,
        block_size=64,
        kv_bytes_per_token=131072,
        logits_bytes=600_000,
        memory_budget_bytes=memory_gib << 30,
        prefill=(RatePoint(at=0, tokens_per_s=2000), RatePoint(at=8192, tokens_per_s=800)),
        decode=(RatePoint(at=1, tokens_per_s=40), RatePoint(at=8, tokens_per_s=20)),
        decode_reference_context=1024,
        restore={"ram": 200_000},
    )
    path.write_text(dump_profile(profile))
    return path


def consecutive_free_ports(count: int) -> int:
    """The first of `count` consecutive ports free now. Bases are tried from a random
    one: test workers (`pytest -n 2`) scanning in the same order took the same ports.
    Below Linux's ephemeral range (32768-60999): a port found free there could be taken by
    any client connection before the fleet bound it (CI saw one, `Address already in use`)."""
    bases = list(range(12000, 32000 - count, 97))
    start = random.randrange(len(bases))
    for base in bases[start:] + bases[:start]:
        try:
            held = []
            for port in range(base, base + count):
                s = socket.socket()
                held.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in held:
                s.close()
    raise RuntimeError("no free ports")
