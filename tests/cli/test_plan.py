"""`warmfleet plan`: the search over fleet sizes (with fake runs: which sizes it tries, in
order, and what it decides), and one plan end to end on simulated Macs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from support.sim import consecutive_free_ports, write_profile
from warmfleet_cli.sim.plan import Trial, search, table


def fake(p95_of: dict[int, float], invalid: frozenset[int] = frozenset()):  # type: ignore[no-untyped-def]
    tried: list[int] = []

    def evaluate(nodes: int) -> Trial:
        tried.append(nodes)
        return Trial(
            nodes=nodes, requests=100, failed=0, first_p50_s=1.0, first_p95_s=p95_of[nodes],
            later_p95_s=1.0, token_hit_rate=0.9, first_hit_rate=0.8, valid=nodes not in invalid,
            invalid_reason="ran 40% late" if nodes in invalid else None, run_dir=f"nodes-{nodes}",
        )  # fmt: skip

    return evaluate, tried


def falling(n: int) -> float:
    return 100.0 / n  # p95 in seconds: more Macs, faster first requests


def test_doubles_until_one_meets_the_target_then_bisects() -> None:
    evaluate, tried = fake({n: falling(n) for n in range(1, 65)})
    decided = search(evaluate, target_s=3.0, low=1, high=64)  # 34 Macs: 2.94 s; 33: 3.03 s
    assert tried == [1, 2, 4, 8, 16, 32, 64, 48, 40, 36, 34, 33]
    assert decided.nodes == 34
    assert "34 Macs" in decided.reason
    rendered = table(decided, 3.0).splitlines()
    assert len(rendered) == 2 + len(tried) and rendered[2].startswith("| 1 |")


def test_the_first_size_meeting_it_is_the_answer() -> None:
    evaluate, tried = fake({4: 1.0})
    assert search(evaluate, target_s=3.0, low=4, high=10).nodes == 4
    assert tried == [4]


def test_no_size_up_to_the_maximum_meets_it() -> None:
    evaluate, tried = fake({n: falling(n) for n in range(1, 11)})
    decided = search(evaluate, target_s=1.0, low=1, high=10)
    assert decided.nodes is None and tried == [1, 2, 4, 8, 10]
    assert "raise --max-nodes" in decided.reason


def test_a_run_the_machine_could_not_keep_up_with_ends_the_plan() -> None:
    evaluate, tried = fake({n: falling(n) for n in range(1, 65)}, invalid=frozenset({16}))
    decided = search(evaluate, target_s=3.0, low=1, high=64)
    assert decided.nodes is None and tried == [1, 2, 4, 8, 16]
    assert "lower --compress" in decided.reason and "40% late" in decided.reason


def test_a_small_plan_on_simulated_macs(tmp_path: Path) -> None:
    """Two developers for half an hour; a generous target met by one Mac, a strict one
    by none of up to two (the figures are this machine's, not asserted)."""
    profile = write_profile(tmp_path / "mac.json", context_length=32768)
    port = consecutive_free_ports(4)
    common = [
        sys.executable, "-m", "warmfleet_cli", "plan", "--profile", str(profile),
        "--developers", "2", "--start", "9:00", "--end", "9:30", "--compress", "60",
        "--sessions-per-day", "16", "--context-tokens", "32768", "--max-nodes", "2",
        "--cache-memory-mb", "8192", "--port", str(port), "--sim-per-process", "2",
    ]  # fmt: skip
    done = subprocess.run(
        [*common, "--target", "100000", "--out", str(tmp_path / "easy")],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    if done.returncode == 3:  # this machine could not keep up: said so, nothing decided
        assert "lower --compress" in done.stdout, done.stdout
        return
    assert done.returncode == 0, done.stderr
    assert "1 Macs: the smallest fleet" in done.stdout
    decided = json.loads((tmp_path / "easy" / "plan.json").read_text())
    assert decided["nodes"] == 1 and [t["nodes"] for t in decided["trials"]] == [1]
    assert decided["trials"][0]["requests"] > 0 and decided["trials"][0]["failed"] == 0
    assert (tmp_path / "easy" / "nodes-1" / "rows.jsonl").stat().st_size > 0
