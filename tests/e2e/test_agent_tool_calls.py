"""A tool round trip through each real agent CLI (opt-in: `pytest --e2e`, with
WARMFLEET_AGENTS_DIR where `npm install @anthropic-ai/claude-code@2.1.332
@openai/codex@0.171.0` was run; written for those versions; skipped when a CLI is not
there).

The daemon runs a scripted model whose script depends on the turn: its first assistant
turn is a Hermes `<tool_call>` (the format the daemon parses for this tokenizer), the
next is text. Claude Code reads a file with its Read tool (allowed headless without a
prompt), Codex runs `cat` through `exec_command` (its default `read-only` sandbox lets
it run here); each CLI's second request must carry the tool's result (in the API's own
shape, as the test's recording of the requests shows, and in the prompt the model was
given), reuse the first request's prefix from the cache, and the session must end with
the scripted text. Codex's thread then takes one more turn with `codex exec resume`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from support.agent_clis import CLAUDE, CODEX, claude, codex, needs
from support.engine import model
from support.processes import serving
from support.scripted import NAME, Recorder, ScriptedModel
from warmfleet_daemon.api.app import create_app
from warmfleet_daemon.engine.core import Engine
from warmfleet_daemon.engine.requests import EngineConfig
from warmfleet_daemon.models.loader import LoadedModel
from warmfleet_daemon.settings import DaemonSettings

pytestmark = pytest.mark.e2e
NOTES = "The deploy window is Tuesday at 14:00, after the database migration.\n"
ANSWER = "Your notes say the deploy window is Tuesday at 14:00."


def call(name: str, arguments: dict[str, object]) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


class SlowFirstPrefill(ScriptedModel):
    """A scripted model whose first request's prefill takes `seconds` more (once past its
    first 1,000 tokens: not the daemon's own short probes at start): a long cold prefill."""

    def __init__(self, *args: Any, seconds: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.seconds = seconds

    def __call__(self, inputs: Any, cache: Any = None) -> Any:
        if self.seconds and cache is not None and cache[0].offset > 1000:
            time.sleep(self.seconds)
            self.seconds = 0.0
        return super().__call__(inputs, cache)


@contextmanager
def scripted_daemon(
    *turns: str, slow_first_prefill: float = 0.0
) -> Iterator[tuple[str, Recorder, SlowFirstPrefill]]:
    """A daemon whose model says `turns[n]` on the n-th assistant turn, with a context
    the agents' ~13k-token requests fit in; yields its URL, the requests it was sent
    and the model (the prompts it was asked to continue)."""
    tokenizer = model("tiny-random").tokenizer
    scripted = SlowFirstPrefill(tokenizer, list(turns), seconds=slow_first_prefill)
    loaded = LoadedModel(scripted, tokenizer, NAME, "a script", 32768, False)  # type: ignore[arg-type]
    engine = Engine(loaded, EngineConfig(block_size=32, cache_budget_bytes=1 << 28))
    recorder = Recorder(
        create_app(DaemonSettings(model=NAME, default_temperature=0.0), engine=engine)
    )
    with serving(recorder) as url:  # type: ignore[arg-type]
        yield url, recorder, scripted


def workspace(tmp_path: Path) -> tuple[Path, Path]:
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    (work / "notes.txt").write_text(NOTES)
    return home, work


@needs(CLAUDE)
def test_claude_code_reads_a_file_and_answers_from_it(tmp_path: Path) -> None:
    home, work = workspace(tmp_path)
    notes = str(work / "notes.txt")
    with scripted_daemon(call("Read", {"file_path": notes}), ANSWER) as (url, recorder, scripted):
        run = claude(
            home, url, "What do my notes say?", "--allowedTools", "Read", model=NAME, cwd=work
        )
    result = run.result
    assert result["is_error"] is False and result["result"] == ANSWER
    assert result["num_turns"] == 2 and result["permission_denials"] == []

    _, second = recorder.bodies("/v1/messages")
    (use,) = [b for b in second["messages"][-2]["content"] if b["type"] == "tool_use"]
    assert use["name"] == "Read" and use["input"] == {"file_path": notes}
    (answer,) = [b for b in second["messages"][-1]["content"] if b["type"] == "tool_result"]
    assert answer["tool_use_id"] == use["id"] and not answer.get("is_error")
    assert NOTES.strip() in json.dumps(answer["content"]).replace("\\t", "\t")

    tokenizer = model("tiny-random").tokenizer
    given = tokenizer.decode(scripted.prompts[-1])
    assert "<tool_response>" in given and NOTES.strip() in given
    # The second request read the whole first prompt from the cache.
    first, again = run.requests
    prompt = first["input_tokens"] + first["cache_creation_input_tokens"]
    assert first["cache_read_input_tokens"] == 0 and again["cache_read_input_tokens"] >= prompt - 1


@needs(CODEX)
def test_codex_runs_a_command_and_answers_from_it_then_resumes(tmp_path: Path) -> None:
    home, work = workspace(tmp_path)
    with scripted_daemon(call("exec_command", {"cmd": "cat notes.txt"}), ANSWER) as (
        url,
        recorder,
        scripted,
    ):
        run = codex(home, url, "What do my notes say?", model=NAME, cwd=work)
        assert run.said() == [ANSWER]
        (command,) = run.items("command_execution")
        assert command["exit_code"] == 0 and command["aggregated_output"] == NOTES

        first, second = recorder.bodies("/v1/responses")
        (sent,) = [i for i in second["input"] if i.get("type") == "function_call"]
        assert sent["name"] == "exec_command" and json.loads(sent["arguments"]) == {
            "cmd": "cat notes.txt"
        }
        (output,) = [i for i in second["input"] if i.get("type") == "function_call_output"]
        assert output["call_id"] == sent["call_id"] and NOTES.strip() in output["output"]
        assert second["input"][: len(first["input"])] == first["input"]

        tokenizer = model("tiny-random").tokenizer
        given = tokenizer.decode(scripted.prompts[-1])
        assert "<tool_response>" in given and NOTES.strip() in given
        assert run.usage()["cached_input_tokens"] > 8_000  # the second request's prefix

        # The thread's next turn: its whole history again, most of it from the cache.
        again = codex(
            home, url, "Thanks. Anything else?", model=NAME, cwd=work, resume=run.thread()
        )
    assert again.said() == [ANSWER] and again.thread() == run.thread()
    third = recorder.bodies("/v1/responses")[-1]
    assert third["input"][: len(second["input"])] == second["input"]
    assert third["prompt_cache_key"] == second["prompt_cache_key"] == run.thread()
    assert again.usage()["cached_input_tokens"] >= len(scripted.prompts[-2]) - 64


@needs(CODEX)
def test_codex_waits_out_a_prefill_longer_than_its_stream_idle_timeout(tmp_path: Path) -> None:
    """Codex restarts a stream after `stream_idle_timeout_ms` without an SSE event; the
    daemon's `keepalive` events during a prefill three times that long keep its one
    request alive (SSE comments did not: it sent the request again)."""
    home, work = workspace(tmp_path)
    with scripted_daemon("Still here.", slow_first_prefill=24.0) as (url, recorder, scripted):
        run = codex(
            home, url, "Say something.", model=NAME, cwd=work, idle_timeout_ms=8000, timeout=240
        )
        assert run.said() == ["Still here."]
        assert len(recorder.bodies("/v1/responses")) == 1  # no retry
        assert scripted.seconds == 0.0  # the slow prefill did happen
