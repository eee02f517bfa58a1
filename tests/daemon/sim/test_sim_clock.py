"""The simulated clock paces to a deadline and tells how late it runs: the daemon's own
time between sleeps is caught up by the next ones; what is not (lateness beyond what can
be caught up, and the lateness a busy period ends with) is `behind_s`, in `/v1/status`
and the metrics, with a warning when a minute's share passes 10%. On a fake wall clock:
nothing here sleeps, and nothing asserts on how fast the machine is."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from support.engine import greedy, request, run
from support.sim import write_profile
from warmfleet_common.perf_profile import PerfProfile, load_profile
from warmfleet_daemon.api.app import create_app
from warmfleet_daemon.engine.requests import EngineConfig
from warmfleet_daemon.settings import DaemonSettings
from warmfleet_daemon.sim.clock import SimClock, SimClockStats, WarningGate
from warmfleet_daemon.sim.engine import SimEngine
from warmfleet_daemon.sim.loader import simulated_model

SPEED = 8.0  # powers of two throughout: the sums below are exact


class Wall:
    """A fake wall clock: time passes when the clock sleeps (exactly, or overrunning by
    `overrun` of each sleep) and when a test says so."""

    def __init__(self, overrun: float = 0.0) -> None:
        self.now = 1000.0
        self.overrun = overrun
        self.slept = 0.0

    def timer(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept += seconds
        self.now += seconds * (1 + self.overrun)


CATCH_UP = 2**-3  # wall seconds the tests' clocks may catch up


def clock(
    wall: Wall,
    quantum_s: float = 0.0,
    gate: WarningGate | None = None,
    catch_up_s: float = CATCH_UP,
) -> SimClock:
    gate = gate or WarningGate()  # each its own: the process's would carry across tests
    return SimClock(
        SPEED, quantum_s, catch_up_s=catch_up_s, timer=wall.timer, sleep=wall.sleep, gate=gate
    )


def busy_step(
    c: SimClock, wall: Wall, charge: float, before: float = 0.0, after: float = 0.0
) -> None:
    """A step that charges `charge` simulated seconds and takes `before` and `after` it
    (wall) of the daemon's own time (the scheduler's, the index's, the GIL's)."""
    c.step_started()
    wall.now += before
    c.spend(charge)
    wall.now += after
    c.step_ended(True)


def idle_step(c: SimClock, wall: Wall, took: float = 0.0) -> None:
    c.step_started()
    wall.now += took
    c.step_ended(False)


def test_the_daemons_own_time_the_charges_cover_is_absorbed() -> None:
    """Each step spends an eighth of its charge's wall time on itself before the charge,
    and its sleep overruns by a quarter: the next sleep is that much shorter, and the
    busy period takes exactly what it charged."""
    wall = Wall(overrun=0.25)
    c = clock(wall)
    start = wall.now
    for i in range(8):
        wall.overrun = 0.25 if i < 7 else 0.0  # the last sleep ends on the deadline
        busy_step(c, wall, 2.0, before=2**-5)  # 0.25 s wall charged
        assert c.behind_s == 0.0
    assert wall.now - start == 8 * 2.0 / SPEED
    assert wall.slept < 8 * 2.0 / SPEED  # each sleep less the step's own time
    idle_step(c, wall)
    assert c.stats() == SimClockStats(SPEED, 16.0, 0.0, 0.0)


def test_a_busy_period_that_ends_late_is_behind_by_that_much() -> None:
    """Time after a step's charge is caught up by the next step's sleep; after the last
    one's, nothing catches it up: the busy period ends that late, and that is behind."""
    wall = Wall()
    c = clock(wall)
    start = wall.now
    busy_step(c, wall, 2.0, after=2**-4)
    busy_step(c, wall, 2.0, after=2**-4)  # slept 0.25 - 2**-4
    assert c.behind_s == 0.0  # not yet: a next charge could catch it up
    assert wall.now - start == 2 * 2.0 / SPEED + 2**-4
    idle_step(c, wall)
    assert c.behind_s == 2**-4 * SPEED  # 0.5 simulated seconds
    assert c.stats() == SimClockStats(SPEED, 4.0, 0.5, 0.5 / 4.0)


def test_lateness_caught_up_by_later_charges_is_not_behind() -> None:
    """A step overruns its deadline by less than `catch_up_s`: the next, shorter than its
    charge, sleeps less and catches up. Behind stays 0, during and after."""
    wall = Wall()
    c = clock(wall)
    start = wall.now
    busy_step(c, wall, 2.0, after=2**-4)  # ends 2**-4 past the deadline
    busy_step(c, wall, 2**-1, before=2**-5)  # 2**-4 wall charged: 2**-5 late after it
    busy_step(c, wall, 2.0)  # sleeps 0.25 - 2**-5: caught up
    assert c.behind_s == 0.0
    idle_step(c, wall)
    assert c.behind_s == 0.0
    assert wall.now - start == (2.0 + 2**-1 + 2.0) / SPEED


def test_a_step_that_overruns_its_deadline_beyond_catching_up_counts_behind() -> None:
    """Past the deadline by more than `catch_up_s` after a charge: the excess is given up
    and counted then (the deadline moves up), and is not taken back when later steps
    catch up the rest."""
    wall = Wall()
    c = clock(wall)
    start = wall.now
    busy_step(c, wall, 2.0, after=0.5)  # 0.5 s wall past the deadline: not known lost yet
    assert c.behind_s == 0.0
    busy_step(c, wall, 2.0)  # its 0.25 covers half: 0.25 late, 0.125 of it given up
    assert c.behind_s == 0.125 * SPEED
    busy_step(c, wall, 2.0)  # sleeps 0.25 - 0.125: the rest caught up
    assert c.behind_s == 0.125 * SPEED
    idle_step(c, wall)
    assert c.behind_s == 0.125 * SPEED  # 1.0 simulated second lost, never more
    assert (wall.now - start) * SPEED - c.spent_s == c.behind_s


def test_a_machine_that_cannot_keep_up_is_behind_by_what_it_took_beyond_its_charge() -> None:
    """Every step takes twice its charge: behind grows as it goes, never decreases, and
    once the period is over it is the period's wall time beyond its charge, exactly."""
    wall = Wall()
    c = clock(wall)
    start, behind = wall.now, 0.0
    for _ in range(16):
        busy_step(c, wall, 2.0, before=2**-2, after=2**-2)  # 0.25 s charged, 0.5 s taken
        assert c.behind_s >= behind
        behind = c.behind_s
    assert behind > 0
    idle_step(c, wall)
    assert c.behind_s == (wall.now - start) * SPEED - c.spent_s == 16 * 2.0


def test_idle_time_is_neither_owed_nor_banked() -> None:
    """A step that finds nothing to do ends the busy period: the next one's deadline is
    anchored at its own start, so an hour idle is not time the engine can run ahead by,
    and a period that ended late does not make the next one start late."""
    wall = Wall()
    c = clock(wall)
    busy_step(c, wall, 2.0, after=2**-4)  # ends late
    wall.now += 3600  # waiting for requests
    idle_step(c, wall, took=5)  # an idle step that took long: not measured
    assert c.behind_s == 2**-4 * SPEED
    slept = wall.slept
    start = wall.now
    busy_step(c, wall, 2.0)
    assert wall.slept - slept == 2.0 / SPEED  # its whole charge: nothing banked
    assert wall.now - start == 2.0 / SPEED
    wall.now += 3600  # no idle step in between: the same busy period
    busy_step(c, wall, 2.0)  # an hour late, beyond catching up
    assert c.behind_s == 2**-4 * SPEED + (3600 - 2.0 / SPEED - CATCH_UP) * SPEED
    assert c.stats().spent_s == 6.0


def test_sleeps_under_the_quantum_wait_for_the_deadline_to_be_a_quantum_ahead() -> None:
    """Under the quantum a charge does not sleep: the deadline runs ahead until it is a
    quantum away, and the next charge sleeps it all. What is left unslept when the engine
    goes idle is not forgiven: a busy period opening before it is due starts then."""
    wall = Wall()
    c = clock(wall, quantum_s=2**-10)
    busy_step(c, wall, 2**-8)  # 2**-11 s wall ahead: sleeps nothing
    assert wall.slept == 0.0
    busy_step(c, wall, 2**-8)  # a quantum ahead: sleeps both
    assert wall.slept == 2**-10
    busy_step(c, wall, 2**-8, after=2**-11)  # unslept, and the step takes as long: on time
    assert wall.slept == 2**-10
    busy_step(c, wall, 2**-8)  # again unslept: the deadline 2**-11 ahead
    idle_step(c, wall)
    busy_step(c, wall, 2**-8)  # opens at the last deadline: sleeps both
    assert wall.slept == 2 * 2**-10
    idle_step(c, wall)
    assert c.behind_s == 0.0


def test_a_minute_behind_by_more_than_a_tenth_is_warned_of_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="warmfleet_daemon.sim.clock")
    wall = Wall()
    c = clock(wall, catch_up_s=0.0)
    for _ in range(40):  # 50 s, each step a quarter longer than its charge (2 s per 8 s)
        busy_step(c, wall, 8.0, before=1.25)
    assert caplog.records == []  # not a minute yet
    for _ in range(10):
        busy_step(c, wall, 8.0, before=1.25)
    (warning,) = [r.getMessage() for r in caplog.records]
    assert "25% behind" in warning and "inflated" in warning and "--sim-speed" in warning
    caplog.clear()
    for _ in range(60):  # behind but for 3%: nothing to say
        busy_step(c, wall, 8.0, before=1 + 2**-5)
    assert caplog.records == []


def test_the_daemons_of_a_process_warn_once_a_minute_between_them(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="warmfleet_daemon.sim.clock")
    wall, gate = Wall(), WarningGate()
    clocks = [clock(wall, gate=gate, catch_up_s=0.0), clock(wall, gate=gate, catch_up_s=0.0)]
    for _ in range(60):  # 150 s, both a quarter longer than they charge
        for c in clocks:
            busy_step(c, wall, 8.0, before=1.25)
    assert len(caplog.records) == 2  # not four


def profile(tmp_path: Path) -> PerfProfile:
    return load_profile(str(write_profile(tmp_path / "mac.json")))


def late_engine(prof: PerfProfile, wall: Wall, late_s: float) -> tuple[SimEngine, list[int]]:
    """A simulated engine on the fake wall whose every decode step runs `late_s` (wall)
    beyond its charge; the list counts those steps."""
    config = EngineConfig(prof.block_size, prof.memory_budget_bytes, max_num_seqs=8)
    c = SimClock(SPEED, timer=wall.timer, sleep=wall.sleep, gate=WarningGate())
    engine = SimEngine(simulated_model(prof), config, prof, clock=c)
    steps: list[int] = []
    decode = engine.decoder.step

    def slow_decode() -> None:
        decode()
        wall.now += late_s
        steps.append(1)

    engine.decoder.step = slow_decode  # type: ignore[method-assign]
    return engine, steps


def test_the_engine_catches_up_the_time_its_steps_take_beyond_their_charge(
    tmp_path: Path,
) -> None:
    """Each decode step takes 2**-10 s (wall) after its charge, less than the next charge
    (a decode step is 1/40 s at 8x, over 3 ms): the next step's sleep absorbs it, and only
    the last one's, which nothing follows, is behind."""
    prof = profile(tmp_path)
    wall = Wall()
    start = wall.now
    engine, steps = late_engine(prof, wall, 2**-10)
    tokens = list(range(3, 3 + 3 * prof.block_size))
    run(engine, request(tokens, sampling=greedy(6)))
    assert len(steps) > 1 and engine.clock.spent_s > 0
    assert engine.clock.behind_s == pytest.approx(2**-10 * SPEED, abs=1e-9)
    assert wall.now - start == pytest.approx(engine.clock.spent_s / SPEED + 2**-10, abs=1e-9)


def test_the_engine_measures_its_busy_steps_only(tmp_path: Path) -> None:
    """Decode steps that take 2**-6 s beyond their charge, more than the next charges
    cover: the engine ran that much longer than it charged, all of it behind."""
    prof = profile(tmp_path)
    wall = Wall()
    start = wall.now
    engine, steps = late_engine(prof, wall, 2**-6)
    tokens = list(range(3, 3 + 3 * prof.block_size))
    run(engine, request(tokens, sampling=greedy(6)))
    assert steps and engine.clock.spent_s > 0
    expected = (wall.now - start) * SPEED - engine.clock.spent_s
    assert expected > 2**-6 * SPEED
    assert engine.clock.behind_s == pytest.approx(expected, abs=1e-9)
    behind = engine.clock.behind_s
    inbox = engine._take_inbox

    def slow_inbox() -> None:  # an idle step that takes long: it did nothing
        wall.now += 60
        inbox()

    engine._take_inbox = slow_inbox  # type: ignore[method-assign]
    assert engine.step() is False
    assert engine.clock.behind_s == behind


def metric_samples(text: str) -> dict[str, float]:
    return {
        s.name: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith("warmfleet_sim_clock_")
    }


@pytest.fixture
def late_daemon(tmp_path: Path) -> Iterator[tuple[TestClient, SimClockStats]]:
    """A simulated daemon whose engine ran a request late before it served."""
    prof = profile(tmp_path)
    wall = Wall()
    engine, _ = late_engine(prof, wall, 2**-9)
    run(engine, request(list(range(3, 200)), sampling=greedy(4)))
    stats = engine.clock.stats()
    assert stats.behind_s > 0
    settings = DaemonSettings(
        engine="sim", profile=str(tmp_path / "mac.json"), daemon_name="sim-clock"
    )
    with TestClient(create_app(settings, engine=engine)) as client:
        deadline = time.monotonic() + 30
        while client.get("/readyz").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        yield client, stats


def test_status_and_metrics_say_how_late_the_simulation_ran(
    late_daemon: tuple[TestClient, SimClockStats],
) -> None:
    client, stats = late_daemon
    sim = client.get("/v1/status").json()["sim"]
    assert sim == {
        "speed": SPEED,
        "spent_s": stats.spent_s,
        "behind_s": stats.behind_s,
        "behind_share": stats.behind_s / stats.spent_s,
    }
    values = metric_samples(client.get("/metrics").text)
    assert values == {
        "warmfleet_sim_clock_spent_seconds_total": pytest.approx(stats.spent_s),
        "warmfleet_sim_clock_behind_seconds_total": pytest.approx(stats.behind_s),
    }
