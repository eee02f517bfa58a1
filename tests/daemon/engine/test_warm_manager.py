"""Warm sets on a running engine (tiny model): strict-prefix warm-up, re-warm on
change and on clear, delete, pinning, limits, the start-up file."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator

import pytest

from support.engine import greedy, model, tokens_of
from warmfleet_common.contract import PromptState, WarmSetSpec
from warmfleet_common.prompts import PromptBuilder
from warmfleet_daemon.engine.core import Engine
from warmfleet_daemon.engine.requests import EngineConfig, GenerationRequest
from warmfleet_daemon.warming.manager import WarmManager
from warmfleet_daemon.warming.sets import (
    Limits,
    WarmSetError,
    WarmSetInvalid,
    WarmSetStale,
    WarmSetTooLarge,
    read_warm_prompts_file,
)

SYSTEM = {"role": "system", "content": "You are Ledger, the finance team's reporting agent. " * 12}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "query_ledger",
            "description": "Run a read-only SQL query on the ledger",
            "parameters": {"type": "object", "properties": {"sql": {"type": "string"}}},
        },
    }
]
FEW_SHOT = [
    SYSTEM,
    {"role": "user", "content": "Revenue for March?"},
    {"role": "assistant", "content": "query_ledger: SELECT sum(amount) ..."},
]


def spec(**prompts: dict) -> WarmSetSpec:
    return WarmSetSpec(prompts=[{"name": n, **p} for n, p in prompts.items()])


@pytest.fixture
def warm() -> Iterator[WarmManager]:
    loaded = model("tiny-random")
    engine = Engine(loaded, EngineConfig(block_size=32, cache_budget_bytes=64 << 20))
    engine.start()
    manager = WarmManager(engine, PromptBuilder(loaded.tokenizer))
    manager.start()
    yield manager
    manager.stop()
    engine.stop()


def wait_warm(manager: WarmManager, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not manager.readiness()[0]:
        assert time.monotonic() < deadline, manager.readiness()[1]
        time.sleep(0.02)


def ask(manager: WarmManager, messages: list[dict], tools: list | None = None):
    prompt = manager.prompts.chat(messages, tools)
    events = manager.engine.generate_blocking(GenerationRequest(prompt, greedy(10)))
    return tokens_of(events), events[-1].usage


def cold_tokens(messages: list[dict], tools: list | None = None) -> list[int]:
    loaded = model("tiny-random")
    engine = Engine(loaded, EngineConfig(block_size=32, cache_budget_bytes=0))
    prompt = PromptBuilder(loaded.tokenizer).chat(messages, tools)
    events: list = []
    engine.submit(GenerationRequest(prompt, greedy(10)), events.append)
    engine.run_until_idle()
    return tokens_of(events)


@pytest.mark.parametrize(
    ("history", "tools"),
    [([SYSTEM], None), ([SYSTEM], TOOLS), (FEW_SHOT, None), (FEW_SHOT, TOOLS)],
    ids=["system", "system+tools", "few-shot", "few-shot+tools"],
)
def test_first_request_after_warm_up_hits_the_whole_prefix(warm, history, tools) -> None:
    status = warm.apply("team", "ledger", spec(main={"messages": history, "tools": tools}))
    assert status.total == 1
    wait_warm(warm)
    prefix_tokens = warm.get("team", "ledger").prompts[0].tokens
    messages = [*history, {"role": "user", "content": "Top five vendors by spend?"}]
    tokens, usage = ask(warm, messages, tools)
    assert usage.cached_tokens == prefix_tokens
    assert tokens == cold_tokens(messages, tools)


def test_same_content_is_idempotent_and_a_change_rewarms_only_that_prompt(warm) -> None:
    other = {"role": "system", "content": "You triage support tickets. " * 10}
    warm.apply("team", "s", spec(a={"messages": [SYSTEM]}, b={"messages": [other]}))
    wait_warm(warm)
    before = {p.name: p for p in warm.get("team", "s").prompts}
    again = warm.apply("team", "s", spec(a={"messages": [SYSTEM]}, b={"messages": [other]}))
    assert {p.name: p.warmed_at for p in again.prompts} == {
        n: p.warmed_at for n, p in before.items()
    }
    changed = {"role": "system", "content": "You triage support tickets for EMEA. " * 10}
    warm.apply("team", "s", spec(a={"messages": [SYSTEM]}, b={"messages": [changed]}))
    wait_warm(warm)
    after = {p.name: p for p in warm.get("team", "s").prompts}
    assert after["a"].warmed_at == before["a"].warmed_at
    assert after["b"].warmed_at != before["b"].warmed_at
    assert after["b"].content_hash != before["b"].content_hash


def test_removed_prompts_are_unpinned_and_delete_drops_everything(warm) -> None:
    other = {"role": "system", "content": "You write release notes. " * 10}
    warm.apply("team", "s", spec(a={"messages": [SYSTEM]}, b={"messages": [other]}))
    wait_warm(warm)
    cache = warm.engine.cache
    both = cache.stats.pinned_count
    warm.apply("team", "s", spec(a={"messages": [SYSTEM]}))
    assert 0 < cache.stats.pinned_count < both
    assert warm.delete("team", "s")
    assert cache.stats.pinned_count == 0
    _, usage = ask(warm, [SYSTEM, {"role": "user", "content": "hi"}])
    assert usage.cached_tokens == 0  # the blocks were dropped, not just unpinned
    assert not warm.delete("team", "s")


def test_clear_really_clears_then_rewarms_in_the_background(warm) -> None:
    warm.apply("team", "s", spec(a={"messages": [SYSTEM]}))
    wait_warm(warm)
    result = warm.clear_cache()
    assert result.status == "cleared" and result.rewarm_scheduled and result.entries_removed > 0
    wait_warm(warm)
    assert warm.engine.cache.stats.entry_count > 0 and warm.engine.cache.stats.pinned_count > 0
    _, usage = ask(warm, [SYSTEM, {"role": "user", "content": "hi"}])
    assert usage.cached_tokens == warm.get("team", "s").prompts[0].tokens


def test_clear_without_warm_sets_makes_the_next_request_cold(warm) -> None:
    messages = [SYSTEM, {"role": "user", "content": "hi"}]
    ask(warm, messages)
    assert ask(warm, messages)[1].cached_tokens > 0
    assert warm.clear_cache().rewarm_scheduled is False
    assert warm.engine.cache.stats.entry_count == 0
    assert ask(warm, messages)[1].cached_tokens == 0


def test_invalid_sets_are_rejected_and_change_nothing(warm) -> None:
    warm.apply("team", "s", spec(a={"messages": [SYSTEM]}))
    wait_warm(warm)
    before = warm.get("team", "s")
    too_long = {"role": "system", "content": "word " * 9000}  # over the 8192-token context
    with pytest.raises(WarmSetError) as err:
        warm.apply("team", "s", spec(a={"messages": [SYSTEM]}, b={"messages": [too_long]}))
    assert isinstance(err.value, WarmSetInvalid) and "'b'" in err.value.message
    assert warm.get("team", "s") == before


def test_limits(warm) -> None:
    warm.limits = Limits(max_sets=1, max_prompts_per_set=2, max_message_chars=1000)
    warm.apply("team", "one", spec(a={"messages": [{"role": "system", "content": "x"}]}))
    with pytest.raises(WarmSetError) as err:
        warm.apply("team", "two", spec(a={"messages": [{"role": "system", "content": "x"}]}))
    assert isinstance(err.value, WarmSetInvalid) and "too many warm sets" in err.value.message
    three = {n: {"messages": [{"role": "system", "content": n}]} for n in "abc"}
    with pytest.raises(WarmSetError) as err:
        warm.apply("team", "one", spec(**three))
    assert isinstance(err.value, WarmSetInvalid)
    with pytest.raises(WarmSetError) as err:
        warm.apply("team", "one", spec(a={"messages": [{"role": "system", "content": "x" * 2000}]}))
    assert isinstance(err.value, WarmSetTooLarge) and err.value.param == "prompts.0.messages.0"


def test_a_set_that_cannot_fit_the_cache_budget_is_rejected(warm) -> None:
    need = warm.engine.block_bytes(len(warm.prompts.shared_prefix([SYSTEM]).tokens))
    warm.limits = Limits(max_pinned_fraction=need / warm.engine.config.cache_budget_bytes / 2)
    with pytest.raises(WarmSetError) as err:
        warm.apply("team", "s", spec(a={"messages": [SYSTEM]}))
    assert isinstance(err.value, WarmSetTooLarge) and "MiB" in err.value.message
    assert warm.list() == []


def test_stale_generation_is_a_conflict(warm) -> None:
    warm.apply(
        "team", "s", WarmSetSpec(generation=5, prompts=[{"name": "a", "messages": [SYSTEM]}])
    )
    with pytest.raises(WarmSetError) as err:
        warm.apply("team", "s", WarmSetSpec(generation=4, prompts=[]))
    assert isinstance(err.value, WarmSetStale)


def test_generations_are_ordered_within_one_uid_only(warm) -> None:
    prompts = [{"name": "a", "messages": [SYSTEM]}]
    warm.apply("team", "s", WarmSetSpec(generation=5, uid="old", prompts=prompts))
    with pytest.raises(WarmSetError) as err:  # same content, older: still refused
        warm.apply("team", "s", WarmSetSpec(generation=4, uid="old", prompts=prompts))
    assert isinstance(err.value, WarmSetStale) and warm.get("team", "s").generation == 5
    # The object was deleted and created again while this node was away.
    status = warm.apply("team", "s", WarmSetSpec(generation=1, uid="new", prompts=[]))
    assert (status.uid, status.generation, status.total) == ("new", 1, 0)


def test_progress_and_summary_are_logged(warm, caplog) -> None:
    caplog.set_level(logging.INFO, logger="warmfleet_daemon.warming.manager")
    other = {"role": "system", "content": "You answer HR questions. " * 8}
    warm.apply("team", "s", spec(a={"messages": [SYSTEM]}, b={"messages": [other]}))
    wait_warm(warm)
    deadline = time.monotonic() + 5
    while "Warm-up done" not in caplog.text and time.monotonic() < deadline:
        time.sleep(0.02)
    assert "Warm-up 1/2" in caplog.text and "Warm-up 2/2" in caplog.text
    assert "Warm-up done (strict-prefix): 2 completed, 0 skipped, 0 failed" in caplog.text


def test_start_up_file_keeps_going_past_a_bad_prompt(warm, tmp_path) -> None:
    path = tmp_path / "prompts.yaml"
    path.write_text(
        "- name: good\n"
        "  messages: [{role: system, content: 'You summarize incidents.'}]\n"
        "- name: too-long\n"
        f"  messages: [{{role: system, content: '{'word ' * 9000}'}}]\n"
    )
    warm.apply("local", "warm-prompts", read_warm_prompts_file(str(path)), keep_going=True)
    deadline = time.monotonic() + 30
    while warm.get("local", "warm-prompts").warm < 1:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    states = {p.name: p for p in warm.get("local", "warm-prompts").prompts}
    assert states["good"].state is PromptState.WARM
    assert states["too-long"].state is PromptState.FAILED and "context" in states["too-long"].error
    assert warm.readiness() == (False, "warm-up failed for: too-long")


def test_vllm_mlx_warm_prompts_format(tmp_path) -> None:
    path = tmp_path / "agents.json"
    path.write_text(json.dumps([[SYSTEM], FEW_SHOT]))
    parsed = read_warm_prompts_file(str(path))
    assert [p.name for p in parsed.prompts] == ["prompt-1", "prompt-2"]
    assert len(parsed.prompts[1].messages) == 3
    path.write_text("{}")
    with pytest.raises(ValueError):
        read_warm_prompts_file(str(path))


@pytest.mark.parametrize("spec_name", ["tiny-random-lfm2", "tiny-random-gemma3"])
def test_warm_up_works_for_caches_that_cannot_be_trimmed(spec_name) -> None:
    loaded = model(spec_name)
    engine = Engine(loaded, EngineConfig(block_size=32, cache_budget_bytes=64 << 20))
    engine.start()
    manager = WarmManager(engine, PromptBuilder(loaded.tokenizer))
    manager.start()
    try:
        manager.apply("team", "s", spec(a={"messages": FEW_SHOT, "tools": TOOLS}))
        wait_warm(manager)
        messages = [*FEW_SHOT, {"role": "user", "content": "And for April?"}]
        prompt = manager.prompts.chat(messages, TOOLS)
        events = engine.generate_blocking(GenerationRequest(prompt, greedy(10)))
        assert events[-1].usage.cached_tokens == manager.get("team", "s").prompts[0].tokens
        cold = Engine(loaded, EngineConfig(block_size=32, cache_budget_bytes=0))
        expected: list = []
        cold.submit(GenerationRequest(prompt, greedy(10)), expected.append)
        cold.run_until_idle()
        assert tokens_of(events) == tokens_of(expected)
    finally:
        manager.stop()
        engine.stop()
