"""`warmfleet up --warm FILE` reads what `warmfleet warm-prompts capture` produces: the
warm-prompts file it writes (JSON or YAML list), the WarmPromptSet it prints, and the
`{prompts: [...]}` form `warmfleet serve --warm-prompts` also reads; anything else is
refused with the file named."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from warmfleet_cli.up import claude_code_compaction, warm_documents
from warmfleet_cli.warm_prompts.files import dump_yaml, warm_prompt_set, write
from warmfleet_common.crd import FLEET_LABEL
from warmfleet_operator.reconcile import matches

CLAUDE = {
    "name": "claude-code",
    "anthropic": {
        "system": [{"type": "text", "text": "You are a coding agent."}],
        "tools": [{"name": "Read", "input_schema": {"type": "object"}}],
    },
}
CODEX = {
    "name": "codex",
    "responses": {
        "input": [{"type": "message", "role": "developer", "content": "You are Codex."}],
    },
}
LOCAL_NODE = {FLEET_LABEL: "local"}  # every WarmNode `up` writes has it


def prompts(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    (wps,) = [d for d in docs if d["kind"] == "WarmPromptSet"]
    assert matches(wps["spec"]["nodeSelector"], LOCAL_NODE)
    return list(wps["spec"]["prompts"])


@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_the_file_a_capture_writes(tmp_path: Path, fmt: str) -> None:
    path = tmp_path / f"agents.{fmt}"
    write(path, [CLAUDE, CODEX], fmt)  # type: ignore[arg-type]
    docs = warm_documents(path)
    assert [p["name"] for p in prompts(docs)] == ["claude-code", "codex"]
    assert docs[0]["metadata"]["name"] == "agents"


def test_the_warm_prompt_set_a_capture_prints(tmp_path: Path) -> None:
    path = tmp_path / "wps.yaml"
    path.write_text(dump_yaml(warm_prompt_set(CLAUDE)))
    assert prompts(warm_documents(path)) == [CLAUDE]


def test_prompts_under_a_prompts_key(tmp_path: Path) -> None:
    path = tmp_path / "agents.json"
    path.write_text(json.dumps({"prompts": [CODEX, [{"role": "system", "content": "Hi."}]]}))
    assert [p["name"] for p in prompts(warm_documents(path))] == ["codex", "prompt-2"]


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("{}", "expected a list of prompts"),
        ('{"prompts": []}', "expected a list of prompts"),
        ("[]", "expected a list of prompts"),
        ("[{}]\n---\n[{}]\n", "not 2 documents"),
        ("kind: ConfigMap\nmetadata: {name: a}\n", "no WarmPromptSet"),
        ('[{"name": "x", "messages": "no"}]', "prompt 1"),
    ],
)
def test_anything_else_is_refused_naming_the_file(tmp_path: Path, text: str, says: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=says) as error:
        warm_documents(path)
    assert str(path) in str(error.value)


@pytest.mark.parametrize(
    ("context", "max_output", "window", "percent"),
    [
        (32768, None, 100_000, 30),  # 30% of 80,000: 24,000 tokens
        (32768, 32, 100_000, 24),  # 24% of 99,968: 23,992 (the long-session bench)
        (8192, None, 100_000, 7),
        (131072, None, 131072, 88),
        (1000, None, 100_000, 1),
    ],
)
def test_claude_code_compacts_at_three_quarters_of_the_served_context(
    context: int, max_output: int | None, window: int, percent: int
) -> None:
    """Claude Code 2.1 reads a compaction window below 100k as 100k and keeps up to 20k
    of it for its answer, so a smaller context is reached through the percentage of
    what is left (measured against a server reporting usage: docs/PERFORMANCE.md)."""
    settings = claude_code_compaction(context, max_output)
    assert settings == {
        "CLAUDE_CODE_AUTO_COMPACT_WINDOW": str(window),
        "CLAUDE_AUTOCOMPACT_PCT_OVERRIDE": str(percent),
    }
    effective = window - min(max_output or 20_000, 20_000)
    assert effective * percent // 100 <= max(context * 3 // 4, effective // 100)
