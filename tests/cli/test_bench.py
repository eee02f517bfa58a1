"""bench-serve's pure parts: statistics, prompt sets, rows and the comparison."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from warmfleet_cli.bench_serve import compare
from warmfleet_cli.bench_serve.prompt_sets import (
    BUILTIN_SETS,
    PromptSetError,
    builtin_system_prompt,
    load_prompt_sets,
    warm_prompts,
)
from warmfleet_cli.bench_serve.report import read_rows, render_rows
from warmfleet_cli.bench_serve.serve import (
    ROW_FIELDS,
    BenchError,
    BenchOptions,
    BenchRun,
    ServerInfo,
    _Cursor,
    _row,
    base_url,
    parse_prometheus_counters,
)
from warmfleet_cli.bench_serve.stats import RequestResult, cell_stats, percentile, summarize


def result(**kw: object) -> RequestResult:
    base: dict[str, object] = dict(
        prompt_set="short",
        concurrency=1,
        repetition=0,
        index=0,
        ttft_s=0.1,
        e2e_s=0.5,
        prompt_tokens=100,
        cached_tokens=80,
        completion_tokens=5,
        finish_reason="stop",
    )
    return RequestResult(**{**base, **kw})  # type: ignore[arg-type]


# -- statistics ----------------------------------------------------------------------


def test_percentiles_interpolate_like_numpy_linear() -> None:
    values = [5.0, 1.0, 4.0, 2.0, 3.0]
    assert percentile(values, 50) == 3.0
    assert percentile(values, 95) == pytest.approx(4.8)
    assert percentile(values, 0) == 1.0 and percentile(values, 100) == 5.0
    assert percentile([7.0], 95) == 7.0
    s = summarize([1.0, None, 3.0])
    assert (s.p50, s.mean, s.count) == (2.0, 2.0, 2)
    assert summarize([None]).p50 is None
    with pytest.raises(ValueError):
        percentile([], 50)


def test_time_per_output_token_excludes_the_first() -> None:
    assert result(ttft_s=0.2, e2e_s=1.0, completion_tokens=5).tpot_s == pytest.approx(0.2)
    assert result(completion_tokens=1).tpot_s is None
    assert result(ttft_s=None).tpot_s is None


def test_cell_stats_count_length_stops_as_successes_and_report_errors() -> None:
    results = [
        result(index=0, finish_reason="length", ttft_s=0.1),
        result(index=1, finish_reason="stop", ttft_s=0.3, cached_tokens=0),
        result(index=2, ttft_s=None, error="HTTP 500: boom", completion_tokens=None),
        result(index=3, ttft_s=None, error="HTTP 500: boom", completion_tokens=None),
        result(index=4, ttft_s=None, error="timed out", completion_tokens=None),
    ]
    stats = cell_stats(results, duration_s=2.0)
    assert (stats.requests, stats.ok, stats.errors, stats.length_finishes) == (5, 2, 3, 1)
    assert stats.ttft.p50 == pytest.approx(0.2)  # failed requests have no TTFT to report
    assert stats.cached_share == pytest.approx(80 / 200)
    assert stats.request_throughput == 1.0 and stats.output_token_throughput == 5.0
    assert stats.error_messages == ("HTTP 500: boom", "timed out")


def test_cached_share_is_unknown_when_the_server_does_not_report_it() -> None:
    stats = cell_stats([result(cached_tokens=None)], duration_s=1.0)
    assert stats.cached_share is None and stats.cached_tokens.mean is None


# -- prompt sets ---------------------------------------------------------------------


def test_builtin_sets_are_agent_messages_after_the_agent_system_prompt() -> None:
    system = builtin_system_prompt()
    assert len(system) > 2000
    sets = load_prompt_sets(",".join(BUILTIN_SETS))
    lengths = {}
    for prompt_set in sets:
        assert len(prompt_set.prompts) >= 6
        for prompt in prompt_set.prompts:
            assert prompt.messages[0] == {"role": "system", "content": system}
            assert prompt.messages[-1]["role"] == "user"
        lengths[prompt_set.name] = statistics.median(
            len(p.messages[-1]["content"]) for p in prompt_set.prompts
        )
    assert lengths["short"] < 200 < lengths["medium"] < 1500 < lengths["long"]
    # One warm prompt covers them all: the system prompt they share.
    assert warm_prompts(sets) == [
        {"name": "bench-1", "messages": [{"role": "system", "content": system}]}
    ]


def test_prompt_files_in_every_shape(tmp_path: Path) -> None:
    lists = tmp_path / "lists.json"
    lists.write_text(
        json.dumps([[{"role": "user", "content": "a"}], [{"role": "user", "content": "b"}]])
    )
    flat = tmp_path / "flat.json"
    flat.write_text(
        json.dumps([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])
    )
    tools = [{"type": "function", "function": {"name": "run_tests"}}]
    jsonl = tmp_path / "agent.jsonl"
    jsonl.write_text(
        json.dumps(
            {
                "messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "a"}],
                "tools": tools,
            }
        )
        + "\n\n"
        + json.dumps([{"role": "user", "content": "b"}])
        + "\n"
    )
    sets = load_prompt_sets(f"{lists},{flat},{jsonl}")
    assert [s.name for s in sets] == ["lists", "flat", "agent"]
    assert all(len(s.prompts) == 2 for s in sets)
    assert sets[0].prompts[0].messages == ({"role": "user", "content": "a"},)  # sent as given
    assert sets[2].prompts[0].tools == tuple(tools)

    replaced = load_prompt_sets(str(jsonl), system_prompt="Mine")
    assert [p.messages[0] for p in replaced[0].prompts] == [
        {"role": "system", "content": "Mine"}
    ] * 2
    assert warm_prompts(replaced) == [
        {"name": "bench-1", "messages": [{"role": "system", "content": "Mine"}], "tools": tools},
        {"name": "bench-2", "messages": [{"role": "system", "content": "Mine"}]},
    ]


def test_bad_prompt_files_say_where(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('[{"role": "user", "content": "a"}]\n{not json\n')
    with pytest.raises(PromptSetError, match=r"bad\.jsonl:2: not valid JSON"):
        load_prompt_sets(str(bad))
    no_role = tmp_path / "norole.json"
    no_role.write_text(json.dumps([[{"content": "a"}]]))
    with pytest.raises(PromptSetError, match=r"item 1: message 0 needs a string `role`"):
        load_prompt_sets(str(no_role))
    with pytest.raises(PromptSetError, match="neither a built-in prompt set"):
        load_prompt_sets("enormous")
    with pytest.raises(PromptSetError, match="must differ"):
        load_prompt_sets("short,short")


def test_requests_never_repeat_an_earlier_prompt() -> None:
    (prompt_set,) = load_prompt_sets("long")
    cursor = _Cursor(prompt_set)
    sent = [json.dumps(cursor.next().body()) for _ in range(3 * len(prompt_set.prompts))]
    assert len(set(sent)) == len(sent)
    assert sent[: len(prompt_set.prompts)] == [json.dumps(p.body()) for p in prompt_set.prompts]


# -- server counters, rows, options -----------------------------------------------


def test_prometheus_counters_of_warmfleet_and_vllm() -> None:
    warmfleet = (
        "# TYPE warmfleet_prefix_cache_hit_tokens_total counter\n"
        'warmfleet_prefix_cache_hit_tokens_total{warmfleet_daemon="a"} 30.0\n'
        'warmfleet_prefix_cache_hit_tokens_total{warmfleet_daemon="b"} 12.0\n'
        "# TYPE warmfleet_prefix_cache_queried_tokens_total counter\n"
        'warmfleet_prefix_cache_queried_tokens_total{warmfleet_daemon="a"} 100.0\n'
    )
    counters = parse_prometheus_counters(warmfleet)
    assert counters is not None and (counters.hit_tokens, counters.queried_tokens) == (42.0, 100.0)
    vllm = (
        "# TYPE vllm:prefix_cache_hits counter\nvllm:prefix_cache_hits_total 5.0\n"
        "# TYPE vllm:prefix_cache_queries counter\nvllm:prefix_cache_queries_total 9.0\n"
    )
    counters = parse_prometheus_counters(vllm)
    assert counters is not None and counters.hit_tokens == 5.0
    assert parse_prometheus_counters("# TYPE up gauge\nup 1\n") is None


def test_base_url_and_options_are_checked() -> None:
    assert base_url("http://h:8000/v1/") == base_url("http://h:8000") == "http://h:8000"
    with pytest.raises(BenchError, match="http://"):
        base_url("h:8000")
    sets = load_prompt_sets("short")
    with pytest.raises(BenchError, match="concurrency"):
        BenchOptions("http://h", sets, [0])
    with pytest.raises(BenchError, match="cache-policy"):
        BenchOptions("http://h", sets, [1], cache_policy="flush")


def bench_run(tag: str, ttft: dict[int, float], cached: float) -> BenchRun:
    options = BenchOptions("http://h:1", load_prompt_sets("short"), list(ttft), tag=tag)
    run = BenchRun(
        ServerInfo("http://h:1", "m", "warmfleet 0.1.0", "/v1/status"), options, "r1", "t0"
    )
    for concurrency, seconds in ttft.items():
        results = [
            result(
                concurrency=concurrency, index=i, ttft_s=seconds, cached_tokens=int(100 * cached)
            )
            for i in range(concurrency)
        ]
        run.results += results
        run.rows.append(_row(run, "short", concurrency, cell_stats(results, 1.0), (50.0, 100.0)))
    return run


def test_rows_round_trip_through_csv_and_json(tmp_path: Path) -> None:
    run = bench_run("cold", {1: 0.5, 4: 0.9}, cached=0.0)
    assert all(tuple(row) == ROW_FIELDS for row in run.rows)
    for fmt in ("csv", "json"):
        path = tmp_path / f"cold.{fmt}"
        path.write_text(render_rows(run, fmt))
        rows = read_rows(path)
        assert [(r["tag"], r["concurrency"], r["ttft_p50_ms"]) for r in rows] == [
            ("cold", 1, 500.0),
            ("cold", 4, 900.0),
        ]
        assert rows[0]["server_software"] == "warmfleet 0.1.0" and rows[0]["server_hit_rate"] == 0.5
    document = json.loads((tmp_path / "cold.json").read_text())
    assert document["run"]["tag"] == "cold" and len(document["requests"]) == 5
    (tmp_path / "junk.csv").write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="not bench-serve output"):
        read_rows(tmp_path / "junk.csv")


def test_compare_table_markdown_and_plot(tmp_path: Path) -> None:
    cold = bench_run("cold", {1: 0.8, 4: 1.2}, cached=0.0).rows
    warm = bench_run("warm", {1: 0.2, 4: 0.4}, cached=0.9).rows
    assert compare.labels(cold, warm, "a.csv", "b.csv") == ("cold", "warm")
    rows = compare.compare(cold, warm)
    assert [(r.concurrency, r.speedup) for r in rows] == [
        (1, pytest.approx(4.0)),
        (4, pytest.approx(3.0)),
    ]
    text = compare.markdown(rows, "cold", "warm")
    assert "| model | concurrency | TTFT cold (ms) | TTFT warm (ms) | speed-up |" in text
    assert "| m | 1 | 800.0 | 200.0 | 4.00x |" in text
    png = compare.plot(rows, "cold", "warm", tmp_path / "cold-vs-warm.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
