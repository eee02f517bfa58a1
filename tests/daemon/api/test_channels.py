"""Models that write channels (gpt-oss's harmony format): the `analysis` channel comes
back as thinking (Anthropic `thinking` blocks, Responses `reasoning` items, chat
completions' `reasoning_content`), streamed and whole; `final` as the answer; a message
to `functions.NAME` as a tool call; and reasoning passed back is rendered where the
template reads it (`thinking`). A scripted model writes harmony on a tokenizer with
harmony's tokens and a template that renders as gpt-oss's (tests/support/harmony.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from support.harmony import GENERATION_PROMPT, TURNS_AFTER, harmony_tokenizer
from support.scripted import ScriptedModel, scripted_engine, serve
from warmfleet_common.prompts import PromptBuilder, reasoning_field
from warmfleet_daemon.api.channels import ChannelSplitter
from warmfleet_daemon.api.output import Piece, merge

THOUGHT = "The user wants a greeting."
ANSWER = "<|channel|>analysis<|message|>The user wants a greeting.<|end|><|start|>assistant"
ANSWER += "<|channel|>final<|message|>Hello!"
CALL = "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant to=functions."
CALL += 'get_weather<|channel|>commentary <|constrain|>json<|message|>{"city": "Paris"}<|call|>'
AFTER_CALL = "<|channel|>final<|message|>Sunny in Paris."
ASK = [{"role": "user", "content": "Greet me."}]
WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def _split(text: str, step: int, **kw: Any) -> list[Piece]:
    splitter = ChannelSplitter(**kw)
    pieces = [p for i in range(0, len(text), step) for p in splitter.feed(text[i : i + step])]
    return merge([*pieces, *splitter.finish()])


@pytest.mark.parametrize("step", [1, 3, 1000])
def test_channels_split_alike_whatever_the_chunks(step: int) -> None:
    assert _split(ANSWER, step) == [Piece("thinking", THOUGHT), Piece("text", "Hello!")]
    # The call ends at its EOS (<|call|> is not in the text the engine gives) or at its
    # marker, with the recipient before or after the channel.
    for text in (CALL.removesuffix("<|call|>"), CALL.replace("functions.get_weather<", "x<")):
        pieces = _split(text, step)
        assert [p.kind for p in pieces] == ["thinking", "tool_call"]
        call = pieces[1].call
        assert call is not None and call["type"] == "function"
        assert call["id"].startswith("call_")
    after = "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{}"
    (call_piece,) = _split(after, step)
    assert call_piece.call is not None
    assert call_piece.call["function"] == {"name": "get_weather", "arguments": "{}"}


def test_preambles_plain_text_and_unparsed_calls_are_text() -> None:
    preamble = "<|channel|>commentary<|message|>Looking it up.<|end|>"
    assert _split(preamble, 2) == [Piece("text", "Looking it up.")]
    assert _split("no channels at all", 2) == [Piece("text", "no channels at all")]
    assert _split(CALL, 5, parse_calls=False) == [
        Piece("thinking", "Need the weather."),
        Piece("text", '{"city": "Paris"}'),
    ]


def test_templates_that_read_thinking_get_it_there() -> None:
    assert reasoning_field(harmony_tokenizer().chat_template) == "thinking"
    qwen3 = "{% if message.reasoning_content %}<think>{{ message.reasoning_content }}"
    assert reasoning_field(qwen3) == "reasoning_content"
    assert reasoning_field("{{ message.content }}") == "reasoning_content"


def test_a_call_with_both_text_and_reasoning_renders_them_as_one_analysis() -> None:
    # gpt-oss's template raises on both (its analysis message is one or the other).
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    assistant = {"role": "assistant", "content": "Looking.", "tool_calls": [call]}
    messages = [
        {"role": "user", "content": "Go."},
        {**assistant, "reasoning_content": "Plan."},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
    ]
    tools = [{"type": "function", "function": WEATHER | {"name": "f"}}]
    text = PromptBuilder(harmony_tokenizer()).chat(messages, tools).text or ""
    assert "<|channel|>analysis<|message|>Plan.\n\nLooking.<|end|>" in text
    # An empty tool_calls list is no call (the template tests the key, then reads [0]).
    empty = [{"role": "user", "content": "Hi."}, {"role": "assistant", "tool_calls": []}]
    assert "<|channel|>final<|message|><|end|>" in (
        PromptBuilder(harmony_tokenizer()).chat([*empty, ASK[0]]).text or ""
    )


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    engine = scripted_engine(
        harmony_tokenizer(), ANSWER, marker=GENERATION_PROMPT, turns_after=TURNS_AFTER
    )
    with serve(engine) as base:
        yield base


def test_anthropic_thinking_blocks_whole_and_streamed(url: str) -> None:
    client = anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0)
    r = client.messages.create(
        model="scripted", max_tokens=60, messages=ASK, thinking={"type": "adaptive"}
    )
    assert [b.type for b in r.content] == ["thinking", "text"]
    assert r.content[0].thinking == THOUGHT and r.content[1].text == "Hello!"
    assert r.stop_reason == "end_turn"
    with client.messages.stream(model="scripted", max_tokens=60, messages=ASK) as stream:
        deltas = [e.delta for e in stream if e.type == "content_block_delta"]
        final = stream.get_final_message()
    assert "".join(d.thinking for d in deltas if d.type == "thinking_delta") == THOUGHT
    assert "".join(d.text for d in deltas if d.type == "text_delta") == "Hello!"
    assert [b.type for b in final.content] == ["thinking", "text"]


def test_responses_reasoning_items_and_chat_reasoning_content(url: str) -> None:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    r = client.responses.create(model="scripted", input="Greet me.")
    reasoning, message = r.output
    assert reasoning.type == "reasoning" and reasoning.content[0].text == THOUGHT
    assert message.type == "message" and r.output_text == "Hello!"
    with client.responses.stream(model="scripted", input="Greet me.") as stream:
        events = list(stream)
    thought = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert (thought, text) == (THOUGHT, "Hello!")
    chat = client.chat.completions.create(model="scripted", messages=ASK)  # type: ignore[arg-type]
    out = chat.choices[0].message
    assert out.content == "Hello!" and out.model_extra["reasoning_content"] == THOUGHT
    chunks = list(client.chat.completions.create(model="scripted", messages=ASK, stream=True))  # type: ignore[arg-type]
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas) == THOUGHT
    assert "".join(d.content or "" for d in deltas) == "Hello!"


@pytest.fixture(scope="module")
def tools() -> Iterator[tuple[str, ScriptedModel]]:
    engine = scripted_engine(
        harmony_tokenizer(), [CALL, AFTER_CALL], marker=GENERATION_PROMPT, turns_after=TURNS_AFTER
    )
    with serve(engine) as base:
        yield base, engine.loaded.model  # type: ignore[misc]


RENDERED_CALL = (
    "<|start|>assistant<|channel|>analysis<|message|>Need the weather.<|end|>"
    "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>"
    '{"city": "Paris"}<|call|><|start|>functions.get_weather to=assistant'
    '<|channel|>commentary<|message|>"sunny"<|end|><|start|>assistant'
)


def test_a_tool_round_trip_renders_the_reasoning_where_the_template_reads_it(
    tools: tuple[str, ScriptedModel],
) -> None:
    url, model = tools
    tokenizer = harmony_tokenizer()
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    ask: list[Any] = [{"role": "user", "content": "Weather in Paris?"}]
    first = client.chat.completions.create(
        model="scripted", messages=ask, tools=[{"type": "function", "function": WEATHER}]
    )
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls or []
    assert call.function.name == "get_weather" and call.function.arguments == '{"city": "Paris"}'
    assert choice.message.model_extra["reasoning_content"] == "Need the weather."
    streamed = list(
        client.chat.completions.create(
            model="scripted",
            messages=ask,
            tools=[{"type": "function", "function": WEATHER}],
            stream=True,
        )
    )
    finishes = [c.choices[0].finish_reason for c in streamed if c.choices]
    calls = [t for c in streamed if c.choices for t in c.choices[0].delta.tool_calls or []]
    assert finishes[-1] == "tool_calls" and [t.index for t in calls] == [0]
    back = [
        *ask,
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": "Need the weather.",
            "tool_calls": [call.model_dump()],
        },
        {"role": "tool", "tool_call_id": call.id, "content": "sunny"},
    ]
    second = client.chat.completions.create(
        model="scripted", messages=back, tools=[{"type": "function", "function": WEATHER}]
    )
    assert second.choices[0].message.content == "Sunny in Paris."
    assert tokenizer.decode(model.prompts[-1]).endswith(RENDERED_CALL)

    # Anthropic: the thinking block passed back is the analysis message again.
    claude = anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0)
    tool = {"name": "get_weather", "description": WEATHER["description"]}
    tool["input_schema"] = WEATHER["parameters"]
    r = claude.messages.create(model="scripted", max_tokens=60, messages=ask, tools=[tool])  # type: ignore[list-item]
    assert [b.type for b in r.content] == ["thinking", "tool_use"] and r.stop_reason == "tool_use"
    use = r.content[1]
    assert use.type == "tool_use" and use.input == {"city": "Paris"}
    history: list[Any] = [
        *ask,
        {"role": "assistant", "content": r.content},  # as the SDK documents it
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "sunny"}],
        },
    ]
    done = claude.messages.create(model="scripted", max_tokens=60, messages=history, tools=[tool])  # type: ignore[list-item]
    assert [b.type for b in done.content] == ["text"] and done.content[0].text == "Sunny in Paris."
    assert tokenizer.decode(model.prompts[-1]).endswith(RENDERED_CALL)


def test_a_forced_call_is_refused_naming_tool_choice(tools: tuple[str, ScriptedModel]) -> None:
    url, _ = tools
    body = {
        "model": "scripted",
        "messages": ASK,
        "tools": [{"type": "function", "function": WEATHER}],
        "tool_choice": "required",
    }
    r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "tool_choice"
    assert "harmony" in r.json()["error"]["message"]
