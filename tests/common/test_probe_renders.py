"""One render for a message's probes (`warmfleet_common.verbatim`): the same texts, so the
same tokens and cuts, as one render per probe; and one render per probe for a template
that does anything to a content but insert it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from support.harmony import harmony_tokenizer
from support.thinking import thinking_tokenizer
from warmfleet_common.prompts import PromptBuilder, RenderedPrompt
from warmfleet_common.verbatim import inserts_verbatim
from warmfleet_daemon.models.loader import load_gguf_tokenizer_only

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file of the repository",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
]


def agent_turns() -> list[list[dict[str, Any]]]:
    """An agent's conversation, one request per turn (each the last plus two messages)."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent. Be terse.\n"},
        {"role": "user", "content": " Fix the failing test in ./pkg"},
    ]
    turns = [list(messages)]
    for turn in range(6):
        messages.append(
            {
                "role": "assistant",
                "content": f"\nLooking at step {turn}:\t<file>",
                "reasoning_content": "think",
            }
        )
        messages.append(
            {"role": "user", "content": ["  next", "\n\nok", "é!", "1.", "<x>", "漢"][turn]}
        )
        turns.append(list(messages))
    return turns


def rendered(builder: PromptBuilder, tools: Any) -> list[RenderedPrompt]:
    return [builder.chat(m, tools) for m in agent_turns()]


@pytest.mark.parametrize("make", [load_gguf_tokenizer_only, thinking_tokenizer, harmony_tokenizer])
@pytest.mark.parametrize("tools", [None, TOOLS])
def test_one_render_gives_the_tokens_and_cuts_of_one_render_per_probe(
    make: Any, tools: Any
) -> None:
    fast = PromptBuilder(make())
    slow = PromptBuilder(make())
    slow._inserts_verbatim = lambda *_: False  # type: ignore[method-assign]
    assert rendered(fast, tools) == rendered(slow, tools)


def test_the_embedded_template_takes_one_render() -> None:
    builder = PromptBuilder(load_gguf_tokenizer_only())
    assert builder._inserts_verbatim(None, {}) and builder._inserts_verbatim(TOOLS, {})


def chatml(content: Any) -> Any:
    def render(messages: Sequence[Mapping[str, Any]]) -> str:
        return "".join(f"<|{m['role']}|>\n{content(m['content'])}<|end|>\n" for m in messages)

    return render


def test_a_template_that_changes_contents_renders_each_probe() -> None:
    assert inserts_verbatim(chatml(lambda c: c))
    assert not inserts_verbatim(chatml(lambda c: c.strip()))  # trims
    assert not inserts_verbatim(chatml(lambda c: c.replace("<", "&lt;")))  # escapes
    assert not inserts_verbatim(chatml(lambda c: f"({len(c)}) {c}"))  # reads it before it
    assert not inserts_verbatim(chatml(lambda c: c + c))  # the sentinel twice

    def refuses(messages: Sequence[Mapping[str, Any]]) -> str:
        raise ValueError("roles must alternate")

    assert not inserts_verbatim(refuses)
