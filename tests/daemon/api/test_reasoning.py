"""Reasoning models: what a model writes between its thinking markers comes back apart
from the answer (Anthropic `thinking` blocks, Responses `reasoning` items, chat
completions' `reasoning_content`), and the request's thinking switch reaches the
template. A scripted model writes `<think>...</think>` on a tokenizer whose template
has Qwen3's `enable_thinking` switch (tests/support/thinking.py)."""

from __future__ import annotations

from collections.abc import Iterator

import anthropic
import openai
import pytest

from support.scripted import scripted_engine, serve
from support.thinking import thinking_tokenizer

SCRIPT = "<think>The user wants a greeting.</think>Hello!"
ASK = [{"role": "user", "content": "Greet me."}]


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with serve(scripted_engine(thinking_tokenizer(), SCRIPT)) as base:
        yield base


def test_anthropic_gets_a_thinking_block_then_the_text(url: str) -> None:
    client = anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0)
    r = client.messages.create(
        model="scripted", max_tokens=50, messages=ASK, thinking={"type": "adaptive"}
    )
    assert [b.type for b in r.content] == ["thinking", "text"]
    assert r.content[0].thinking == "The user wants a greeting."
    assert r.content[1].text == "Hello!"
    with client.messages.stream(
        model="scripted", max_tokens=50, messages=ASK, thinking={"type": "adaptive"}
    ) as stream:
        kinds = [e.delta.type for e in stream if e.type == "content_block_delta"]
        final = stream.get_final_message()
    assert "thinking_delta" in kinds and "text_delta" in kinds
    assert final.content[0].thinking == r.content[0].thinking
    hidden = client.messages.create(
        model="scripted",
        max_tokens=50,
        messages=ASK,
        thinking={"type": "adaptive", "display": "omitted"},
    )
    assert hidden.content[0].thinking == "" and hidden.content[1].text == "Hello!"


@pytest.mark.parametrize(
    "thinking",
    [{"type": "adaptive", "display": "updates"}, {"type": "enabled", "budget_tokens": 64}],
)
def test_thinking_shown_as_updates_is_the_thinking_as_written(
    url: str, thinking: dict[str, object]
) -> None:
    # Claude Code 2.1's stream-json mode (claude -p --output-format stream-json) asks
    # for `display: "updates"`, a beta value.
    client = anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0)
    r = client.beta.messages.create(
        model="scripted",
        max_tokens=50,
        messages=ASK,  # type: ignore[arg-type]
        thinking={**thinking, "display": "updates"},  # type: ignore[typeddict-item]
    )
    first = r.content[0]
    assert first.type == "thinking" and first.thinking == "The user wants a greeting."


def test_the_thinking_switch_reaches_the_template(url: str) -> None:
    client = anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0)

    def tokens(thinking: dict[str, object]) -> int:
        return client.messages.count_tokens(
            model="scripted",
            messages=ASK,
            thinking=thinking,  # type: ignore[arg-type]
        ).input_tokens

    # Off: the template closes an empty thinking section itself (four more tokens).
    assert tokens({"type": "disabled"}) > tokens({"type": "adaptive"})


def test_responses_and_chat_completions_separate_the_reasoning(url: str) -> None:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    r = client.responses.create(model="scripted", input="Greet me.", reasoning={"effort": "low"})
    reasoning, message = r.output
    assert reasoning.type == "reasoning"
    assert reasoning.content[0].text == "The user wants a greeting."
    assert message.type == "message" and r.output_text == "Hello!"
    assert r.usage.output_tokens_details.reasoning_tokens > 0
    with client.responses.stream(model="scripted", input="Greet me.") as stream:
        kinds = [e.type for e in stream]
    assert "response.reasoning_text.delta" in kinds and "response.output_text.delta" in kinds
    chat = client.chat.completions.create(model="scripted", messages=ASK)
    message_out = chat.choices[0].message
    assert message_out.content == "Hello!"
    assert message_out.model_extra["reasoning_content"] == "The user wants a greeting."
    chunks = list(client.chat.completions.create(model="scripted", messages=ASK, stream=True))
    streamed = "".join(
        (c.choices[0].delta.model_extra or {}).get("reasoning_content") or ""
        for c in chunks
        if c.choices
    )
    assert streamed == "The user wants a greeting."
