"""`warmfleet sim trace`: agent-population traces are deterministic, in time order, scale
with the compression, and rebuild requests that the daemon's own API models accept and
that extend each other turn after turn, as the real CLIs' do."""

from __future__ import annotations

import io
import itertools
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from warmfleet_cli.main import main
from warmfleet_cli.sim.bodies import BodyOptions, SessionBodies, materialize
from warmfleet_cli.sim.logs import logged_request, read_request_log
from warmfleet_cli.sim.population import AGENTS, Quantiles
from warmfleet_cli.sim.trace import FORMAT, TraceParams, dump, generate, read, sessions
from warmfleet_common.agent_apis.anthropic import MessagesRequest
from warmfleet_common.agent_apis.responses import ResponsesRequest

PARAMS = TraceParams(developers=12, seed=3, context_tokens=32_768)


@pytest.fixture(scope="module")
def trace() -> Any:
    return generate(PARAMS)


def _text(params: TraceParams) -> str:
    out = io.StringIO()
    dump(generate(params), out)
    return out.getvalue()


def test_the_same_parameters_give_the_same_bytes() -> None:
    assert _text(PARAMS) == _text(PARAMS)
    assert _text(PARAMS) != _text(replace(PARAMS, seed=4))


def test_adding_developers_leaves_the_others_sessions_as_they_were(trace: Any) -> None:
    more = generate(replace(PARAMS, developers=PARAMS.developers + 5))
    mine = [r for r in more.records if "event" not in r and r["dev"] < PARAMS.developers]
    assert mine == [r for r in trace.records if "event" not in r]


def test_records_and_events_are_in_time_order(trace: Any) -> None:
    times = [r["t"] for r in trace.records]
    assert times == sorted(times)
    events = {r["event"]: r for r in trace.records if "event" in r}
    hour = 3600 / PARAMS.compress
    assert events["node-lost"] == {"t": 1.5 * hour, "event": "node-lost", "node": 0}
    assert events["nodes-added"] == {"t": 5 * hour, "event": "nodes-added", "count": 2}
    assert events["rolling-restart"]["t"] == 7 * hour
    upgrade = events["agent-upgrade"]
    assert upgrade == {"t": 3 * hour, "event": "agent-upgrade", "agent": "claude-code"} | {
        "from": "2.1.332",
        "to": "2.1.333",
    }
    for steps in sessions(trace.records).values():
        assert [s["turn"] for s in steps] == list(range(len(steps)))
        assert steps[-1].get("end") is True
        assert all(a["t"] <= b["t"] for a, b in itertools.pairwise(steps))


def test_compression_scales_every_time(trace: Any) -> None:
    slower = generate(replace(PARAMS, compress=PARAMS.compress / 2))
    assert len(slower.records) == len(trace.records)
    order = lambda r: (r.get("session", ""), r.get("turn", 0), r.get("event", ""))  # noqa: E731
    pairs = zip(sorted(trace.records, key=order), sorted(slower.records, key=order), strict=True)
    for fast, slow in pairs:
        assert slow["t"] == pytest.approx(2 * fast["t"], abs=0.002)
        assert {k: v for k, v in slow.items() if k not in ("t", "gap")} == {
            k: v for k, v in fast.items() if k not in ("t", "gap")
        }
    assert slower.header["summary"]["duration_s"] == 2 * trace.header["summary"]["duration_s"]


def test_the_header_says_where_every_number_comes_from(trace: Any) -> None:
    header = trace.header
    assert header["format"] == FORMAT
    assert header["params"]["developers"] == PARAMS.developers
    sources = header["sources"]
    for name in ("sessions_per_day", "requests_per_session", "human_wait_s", "tool_wait_s"):
        assert sources[name]
    for agent in AGENTS:
        assert "measured here" in sources[f"{agent}.first_request"]
        assert "TraceLab" in sources[f"{agent}.output"]
    assert "assumption" in sources["human_wait_s"]
    # Configured or derived numbers say so, not "measured" (compact_at is make run's setting).
    assert sources["compaction.compact_at"].startswith("configured:")
    for derived in ("compaction.summary_tokens", "compaction.instruction_tokens"):
        assert sources[derived].startswith("estimated from what was measured here:")


def _all_requests(trace: Any, limit: int = 40) -> list[tuple[list[Any], list[Any]]]:
    """(steps, requests) of the first `limit` sessions, built step by step."""
    options = BodyOptions.of(trace.header)
    out = []
    for steps in list(sessions(trace.records).values())[:limit]:
        builder = SessionBodies(options)
        out.append((steps, [builder.request(s) for s in steps]))
    return out


def test_bodies_validate_as_the_daemon_parses_them(trace: Any) -> None:
    kinds: set[tuple[str, str]] = set()
    for steps, requests in _all_requests(trace):
        for step, request in zip(steps, requests, strict=True):
            kinds.add((step["agent"], step["kind"]))
            if step["agent"] == "claude-code":
                assert request.path == "/v1/messages?beta=true"
                parsed = MessagesRequest.model_validate(request.body)
                assert parsed.max_tokens == step["out"] and parsed.stream
                assert request.headers["X-Claude-Code-Session-Id"] == step["session"]
                assert (
                    json.loads(request.body["metadata"]["user_id"])["session_id"]
                    == (step["session"])
                )
            else:
                assert request.path == "/v1/responses"
                parsed_r = ResponsesRequest.model_validate(request.body)
                assert parsed_r.max_output_tokens == step["out"] and parsed_r.stream
                assert parsed_r.prompt_cache_key == step["session"]
    assert {("claude-code", "tool"), ("codex", "tool"), ("claude-code", "user")} <= kinds
    assert {k for _, k in kinds} >= {"compact", "resume"}  # 32k: sessions compact


def test_each_step_extends_the_previous_one(trace: Any) -> None:
    checked = 0
    for steps, requests in _all_requests(trace):
        key = "messages" if steps[0]["agent"] == "claude-code" else "input"
        for i in range(1, len(steps)):
            before, after = requests[i - 1].body, requests[i].body
            if steps[i]["kind"] in ("compact", "resume") or steps[i - 1]["kind"] == "compact":
                continue
            assert after[key][: len(before[key])] == before[key]
            assert len(after[key]) > len(before[key])
            assert (after["system"] if key == "messages" else None) == (
                before["system"] if key == "messages" else None
            )
            assert after["tools"] == before["tools"]
            checked += 1
        # The compaction request extends the conversation too (a prefix hit).
        for i, step in enumerate(steps):
            if step["kind"] == "compact" and i:
                before, after = requests[i - 1].body[key], requests[i].body[key]
                assert after[: len(before)] == before
    assert checked > 100


def test_materialize_rebuilds_a_step_from_its_history(trace: Any) -> None:
    steps, requests = max(_all_requests(trace, 10), key=lambda pair: len(pair[0]))
    options = BodyOptions.of(trace.header)
    for i in (0, 1, len(steps) - 1):
        path, headers, body = materialize(steps[i], steps[:i], options)
        assert (path, headers, body) == (requests[i].path, requests[i].headers, requests[i].body)


def test_a_reply_given_replaces_the_pseudo_text(trace: Any) -> None:
    steps = next(s for s in sessions(trace.records).values() if len(s) > 2)
    builder = SessionBodies(BodyOptions.of(trace.header))
    builder.request(steps[0])
    body = builder.request(steps[1], reply="what the engine said").body
    key = "messages" if steps[0]["agent"] == "claude-code" else "input"
    assert "what the engine said" in json.dumps(body[key])


def test_first_requests_are_as_large_as_the_real_clis(trace: Any) -> None:
    """The measured first requests: Claude Code 2.1.332 12,756 tokens, Codex 0.171.0
    9,111 (docs/PERFORMANCE.md), at ~4 characters a token."""
    seen = set()
    for steps, requests in _all_requests(trace):
        agent, body = steps[0]["agent"], requests[0].body
        if agent in seen:
            continue
        seen.add(agent)
        words = steps[0]["user"] * 4
        size = len(json.dumps(body)) - words
        expected = 12_756 * 4 if agent == "claude-code" else 9_111 * 4
        assert 0.85 * expected < size < 1.25 * expected, (agent, size)
    assert seen == set(AGENTS)


def test_the_upgrade_changes_new_sessions_only(trace: Any) -> None:
    upgrade_at = next(r["t"] for r in trace.records if r.get("event") == "agent-upgrade")
    firsts = [r for r in trace.records if r.get("turn") == 0 and r["agent"] == "claude-code"]
    before = [r for r in firsts if r["t"] < upgrade_at]
    after = [r for r in firsts if r["t"] >= upgrade_at]
    assert before and after
    assert {r["version"] for r in before} == {"2.1.332"}
    assert {r["version"] for r in after} == {"2.1.333"}
    # Sessions keep their version to their end, across the upgrade.
    for steps in sessions(trace.records).values():
        assert len({s["version"] for s in steps}) == 1
    options = BodyOptions.of(trace.header)
    old = materialize(before[0], [], options)[2]
    new = materialize(after[0], [], options)[2]
    assert old["system"][2]["text"] != new["system"][2]["text"]
    half = len(old["system"][2]["text"]) // 3
    assert old["system"][2]["text"][:half] == new["system"][2]["text"][:half]
    assert "Monitor" in [t["name"] for t in new["tools"]]
    assert "Monitor" not in [t["name"] for t in old["tools"]]
    assert old["tools"][:3] == new["tools"][:3] and old["tools"][3] != new["tools"][3]


def test_claude_memory_makes_the_system_prompt_per_developer() -> None:
    trace = generate(replace(PARAMS, claude_memory=True))
    options = BodyOptions.of(trace.header)
    firsts = [r for r in trace.records if r.get("turn") == 0 and r["agent"] == "claude-code"]
    devs = {r["dev"]: r for r in firsts if r["version"] == "2.1.332"}
    a, b = list(devs.values())[:2]
    text_a = materialize(a, [], options)[2]["system"][2]["text"]
    text_b = materialize(b, [], options)[2]["system"][2]["text"]
    assert text_a != text_b and f"dev{a['dev']:03d}/.claude/projects" in text_a


def test_a_large_population_stays_small() -> None:
    trace = generate(TraceParams(developers=200))
    out = io.StringIO()
    dump(trace, out)
    assert trace.header["summary"]["sessions"] > 400
    assert len(out.getvalue()) < 30 << 20


def test_quantiles_interpolate_between_the_published_points() -> None:
    q = Quantiles(((0, 0), (0.5, 10), (0.9, 1000), (1, 1000)), "test")
    assert q.sample(0.25) == 5
    assert q.sample(0.7) == pytest.approx(100)
    assert q.sample(0.95) == pytest.approx(1000)


def test_the_cli_writes_a_trace_and_reads_back(tmp_path: Path) -> None:
    out = tmp_path / "t.jsonl"
    argv = ["sim", "trace", "--developers", "3", "--out", str(out), "--upgrade", "codex@13:00"]
    assert main([*argv, "--node-lost", "none", "--rolling-restart", "15:30"]) == 0
    header, records = read(out)
    assert header["params"]["upgrades"] == [["codex", 13.0]]
    events = [r["event"] for r in records if "event" in r]
    assert sorted(events) == ["agent-upgrade", "nodes-added", "rolling-restart"]
    assert main(["sim", "trace", "--developers", "0", "--out", str(out)]) == 2
    with pytest.raises(SystemExit):
        main(["sim", "trace", "--out", str(out), "--start", "25:00"])


def test_a_request_log_in_the_audit_format_reads_as_records(tmp_path: Path) -> None:
    log = tmp_path / "requests.jsonl"
    lines = [
        {"messages": [{"role": "user", "content": "hi"}], "tools": None},
        {"request": {"messages": [{"role": "user", "content": "there"}], "temperature": 0}},
        {"prompt": "<s>rendered"},
        "a bare prompt",
        {"t": 0.5, "messages": [{"role": "user", "content": "early"}]},
        {"nothing": 1},
    ]
    log.write_text("\n".join(json.dumps(x) for x in lines) + "\nnot json\n")
    read_log = read_request_log(log, interval=2.0)
    assert [r["t"] for r in read_log.records] == [0.0, 0.5, 2.0, 4.0, 6.0]
    assert [line for line, _ in read_log.skipped] == [6, 7]
    first = logged_request(read_log.records[0])
    assert first.path == "/v1/chat/completions" and first.body["stream"] is True
    assert first.body["messages"] == [{"role": "user", "content": "hi"}]
    by_line = {r["line"]: r for r in read_log.records}
    assert by_line[2]["body"]["temperature"] == 0
    assert logged_request(by_line[3]).path == "/v1/completions"
    assert by_line[4]["body"]["prompt"] == "a bare prompt"
    assert "t" not in by_line[5]["body"]


def test_an_event_outside_the_day_is_refused_and_a_default_one_left_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "t.jsonl"
    day = ["sim", "trace", "--developers", "3", "--out", str(out), "--start", "11:00"]
    assert main([*day, "--end", "13:00", "--node-lost", "10:30"]) == 2
    assert "the node lost at 10:30 is outside the working day (11:00-13:00)" in (
        capsys.readouterr().err
    )
    assert not out.exists()
    # Not asked for: the defaults (10:30, 12:00, 14:00, 16:00) that fall within 11-13 only.
    assert main([*day, "--end", "13:00"]) == 0
    _, records = read(out)
    assert [r["event"] for r in records if "event" in r] == ["agent-upgrade"]
    assert all(r["t"] >= 0 for r in records)
