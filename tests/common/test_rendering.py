"""The router's chat rendering without transformers' per-call conversions renders exactly
what `apply_chat_template` renders, and is not used where it would not."""

from __future__ import annotations

from typing import Any

import pytest

from support.engine import model
from warmfleet_common.cache_layout import LayoutTokenizer, export_layout
from warmfleet_common.chunking import root_key
from warmfleet_common.rendering import FastRenderer

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "grep",
            "description": "Search files",
            "parameters": {"type": "object", "properties": {"pattern": {"type": "string"}}},
        },
    }
]
CHATS: list[list[dict[str, Any]]] = [
    [{"role": "user", "content": "hi"}],
    [
        {"role": "system", "content": "\n Be brief.\t"},
        {"role": "user", "content": "find TODOs", "name": None},
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": "grep it",
            "tool_calls": [{"type": "function", "function": {"name": "grep", "arguments": {}}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "a.py:3: TODO"},
        {"role": "assistant", "content": "One.", "reasoning": "counted"},
        {"role": "user", "content": "漢字 🙂 <|im_end|> inside"},
    ],
]


@pytest.fixture(scope="module")
def layout_tokenizer() -> LayoutTokenizer:
    tokenizer = model("tiny-random").tokenizer
    return LayoutTokenizer(export_layout(tokenizer, model="m", root=root_key("r"), block_size=8))


def test_it_renders_what_transformers_renders(layout_tokenizer: LayoutTokenizer) -> None:
    fast = layout_tokenizer._fast
    assert fast is not None
    hf = layout_tokenizer._hf

    def outcome(render: Any, chat: Any, **kwargs: Any) -> Any:
        try:
            return render(chat, **kwargs)
        except Exception as exc:  # the same error: this template wants a content
            return type(exc)

    rendered = 0
    for chat in CHATS:
        for tools in (None, TOOLS):
            for generation in (False, True):
                args = {"tools": tools, "add_generation_prompt": generation}
                expected = outcome(hf.apply_chat_template, chat, tokenize=False, **args)
                assert outcome(fast.render, chat, **args) == expected
                found = outcome(layout_tokenizer.apply_chat_template, chat, tokenize=False, **args)
                assert found == expected
                rendered += isinstance(expected, str)
    assert rendered >= 4


def test_no_fast_path_where_a_sample_renders_differently(layout_tokenizer: LayoutTokenizer) -> None:
    class Other:
        """A tokenizer whose apply_chat_template is not its template's plain render."""

        chat_template = layout_tokenizer._hf.chat_template
        special_tokens_map = layout_tokenizer._hf.special_tokens_map

        def apply_chat_template(self, messages: Any, **kwargs: Any) -> str:
            return "something else"

    assert FastRenderer.checked(Other(), {}) is None

    several = Other()
    several.chat_template = {"default": "{{ messages }}", "tool_use": "{{ tools }}"}  # type: ignore[assignment]
    assert FastRenderer.checked(several, {}) is None
