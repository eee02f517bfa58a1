"""What agent frameworks send, end to end through real HTTP and the official `openai`
client, on a scripted model (tests/scripted.py) whose output is known: tool calls parsed
by the model family's format, streamed as deltas, forced by `tool_choice`, and grammar
masks that make the output follow `response_format` whatever the model prefers."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Any

import jsonschema
import openai
import pytest
from pydantic import BaseModel

from support.engine import model
from support.scripted import scripted_engine, serve

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
UNIT = {
    "type": "function",
    "function": {
        "name": "set_unit",
        "parameters": {
            "type": "object",
            "properties": {"unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["unit"],
            "additionalProperties": False,
        },
    },
}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
VERDICT = {
    "type": "object",
    "properties": {"answer": {"enum": ["yes", "no"]}, "sure": {"type": "boolean"}},
    "required": ["answer", "sure"],
    "additionalProperties": False,
}

Client = Callable[..., openai.OpenAI]


@pytest.fixture
def client() -> Iterator[Client]:
    """client(script, fallback=...) -> an openai client on a daemon serving that script."""
    tokenizer = model("tiny-random").tokenizer
    with ExitStack() as stack:

        def make(script: str, **kw: Any) -> openai.OpenAI:
            url = stack.enter_context(serve(scripted_engine(tokenizer, script, **kw)))
            return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)

        yield make


def test_a_tool_call_comes_back_as_tool_calls_with_finish_reason_tool_calls(client) -> None:
    c = client(f"Let me check.\n{CALL}")
    r = c.chat.completions.create(model="scripted", messages=ASK, tools=[WEATHER])
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me check.\n"
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}


def test_streamed_tool_calls_arrive_as_deltas_and_never_leak_the_markup(client) -> None:
    c = client(f"On it.\n{CALL}\n{CALL.replace('Paris', 'Oslo')}")
    chunks = list(
        c.chat.completions.create(model="scripted", messages=ASK, tools=[WEATHER], stream=True)
    )
    content = "".join(ch.choices[0].delta.content or "" for ch in chunks)
    assert content.strip() == "On it." and "<tool" not in content
    calls = [tc for ch in chunks for tc in ch.choices[0].delta.tool_calls or []]
    assert [tc.index for tc in calls] == [0, 1]
    assert [json.loads(tc.function.arguments)["city"] for tc in calls] == ["Paris", "Oslo"]
    assert all(tc.id and tc.function.name == "get_weather" for tc in calls)
    assert [ch.choices[0].finish_reason for ch in chunks][-1] == "tool_calls"


def test_a_call_cut_short_by_max_tokens_is_still_parsed_and_finishes_with_length(client) -> None:
    c = client(f"{CALL}\n{CALL}")
    cut = len(model("tiny-random").tokenizer.encode(f"{CALL}\n{CALL}")) - 2
    r = c.chat.completions.create(model="scripted", messages=ASK, tools=[WEATHER], max_tokens=cut)
    assert r.choices[0].finish_reason == "length"
    assert [tc.function.name for tc in r.choices[0].message.tool_calls] == ["get_weather"] * 2
    one = len(model("tiny-random").tokenizer.encode(CALL))
    r = c.chat.completions.create(
        model="scripted", messages=ASK, tools=[WEATHER], max_tokens=one + 10
    )
    # The second call's JSON is incomplete: it comes back as text, as written.
    assert len(r.choices[0].message.tool_calls) == 1
    assert r.choices[0].message.content.startswith("\n<tool_call>\n{")


def test_tool_choice_none_returns_the_text_and_parallel_false_keeps_one_call(client) -> None:
    c = client(f"{CALL}\n{CALL}")
    r = c.chat.completions.create(
        model="scripted", messages=ASK, tools=[WEATHER], tool_choice="none"
    )
    assert r.choices[0].finish_reason == "stop" and r.choices[0].message.tool_calls is None
    assert r.choices[0].message.content == f"{CALL}\n{CALL}"
    r = c.chat.completions.create(
        model="scripted", messages=ASK, tools=[WEATHER], parallel_tool_calls=False
    )
    assert r.choices[0].finish_reason == "tool_calls" and len(r.choices[0].message.tool_calls) == 1


def test_tool_choice_required_and_named_force_a_valid_call(client) -> None:
    c = client("I would rather chat about the weather.", fallback={"fahrenheit": 1.0})
    for choice, name in (
        ("required", None),
        ({"type": "function", "function": {"name": "set_unit"}}, "set_unit"),
    ):
        r = c.chat.completions.create(
            model="scripted",
            messages=ASK,
            tools=[UNIT, WEATHER] if name else [UNIT],
            tool_choice=choice,
        )
        assert r.choices[0].finish_reason == "tool_calls"
        (call,) = r.choices[0].message.tool_calls
        assert call.function.name == "set_unit"
        arguments = json.loads(call.function.arguments)
        jsonschema.validate(arguments, UNIT["function"]["parameters"])


def test_tool_history_goes_back_through_the_template(client) -> None:
    c = client("It is 18 degrees in Paris.")
    messages = [
        *ASK,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "18C, clear"},
    ]
    r = c.chat.completions.create(model="scripted", messages=messages, tools=[WEATHER])
    assert r.choices[0].message.content == "It is 18 degrees in Paris."
    from warmfleet_common.prompts import PromptBuilder

    text = PromptBuilder(model("tiny-random").tokenizer).chat(messages, [WEATHER]).text
    assert (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text
    )
    assert "<tool_response>\n18C, clear\n</tool_response>" in text


def test_json_schema_passes_valid_output_through_and_masks_invalid_output(client) -> None:
    fmt = {
        "type": "json_schema",
        "json_schema": {"name": "verdict", "schema": VERDICT, "strict": True},
    }
    valid = '{"answer": "no", "sure": true}'
    r = client(valid).chat.completions.create(model="scripted", messages=ASK, response_format=fmt)
    assert r.choices[0].message.content == valid and r.choices[0].finish_reason == "stop"
    c = client('Sure! {"answer": "maybe", "sure": "very"} Anything else?')
    for stream in (False, True):
        if stream:
            chunks = c.chat.completions.create(
                model="scripted", messages=ASK, response_format=fmt, stream=True
            )
            text = "".join(ch.choices[0].delta.content or "" for ch in chunks)
        else:
            r = c.chat.completions.create(model="scripted", messages=ASK, response_format=fmt)
            text = r.choices[0].message.content
        jsonschema.validate(json.loads(text), VERDICT)


def test_json_object_and_the_clients_pydantic_parse_helper(client) -> None:
    # The model wants a list; the mask only lets an object start, and the model's next
    # preferences ("}" over "{") close it.
    c = client('["a list", "not an object"]', fallback={"{": 1.0, "}": 2.0})
    r = c.chat.completions.create(
        model="scripted", messages=ASK, response_format={"type": "json_object"}
    )
    assert json.loads(r.choices[0].message.content) == {}

    class Verdict(BaseModel):
        answer: str
        sure: bool

    c = client('{"answer": "yes", "sure": false}')
    parsed = c.chat.completions.parse(model="scripted", messages=ASK, response_format=Verdict)
    assert parsed.choices[0].message.parsed == Verdict(answer="yes", sure=False)


def test_logprobs_n_penalties_bias_and_user(client) -> None:
    c = client("one two three")
    r = c.chat.completions.create(
        model="scripted", messages=ASK, logprobs=True, top_logprobs=3, n=3, user="agent-7", seed=1
    )
    assert [ch.message.content for ch in r.choices] == ["one two three"] * 3
    assert [ch.index for ch in r.choices] == [0, 1, 2]
    assert r.usage.completion_tokens == 3 * (
        len(model("tiny-random").tokenizer.encode("one two three")) + 1
    )
    content = r.choices[0].logprobs.content
    assert "".join(t.token for t in content) == "one two three"
    for entry in content:
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].token == entry.token
        assert bytes(entry.bytes).decode() == entry.token
    # A bias of -100 on the scripted first token makes the model say something else.
    first = model("tiny-random").tokenizer.encode("one")[0]
    r = c.chat.completions.create(model="scripted", messages=ASK, logit_bias={str(first): -100})
    assert not r.choices[0].message.content.startswith("one")
    # Penalties run (their effect is tested on the engine); the script wins by a wide margin.
    r = c.chat.completions.create(
        model="scripted",
        messages=ASK,
        presence_penalty=1.5,
        frequency_penalty=0.5,
        extra_body={"repetition_penalty": 1.2},
    )
    assert r.choices[0].message.content == "one two three"


UNSUPPORTED = [
    "functions",
    "audio",
    "modalities",
    "prediction",
    "web_search_options",
    "store",
    "top_k",
]


@pytest.mark.parametrize("name", UNSUPPORTED)
def test_unsupported_parameters_are_refused_by_name(client, name) -> None:
    c = client("x")
    with pytest.raises(openai.BadRequestError) as err:
        c.chat.completions.create(model="scripted", messages=ASK, extra_body={name: True})
    assert err.value.body["param"] == name and name in err.value.body["message"]
    if name == "store":  # nothing is stored: `store: false` is what happens
        r = c.chat.completions.create(model="scripted", messages=ASK, store=False)
        assert r.choices[0].message.content == "x"


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"tool_choice": "required"}, "tool_choice"),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice",
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "bogus"}},
                }
            },
            "response_format",
        ),
        (
            {
                "tools": [UNIT],
                "tool_choice": "required",
                "response_format": {"type": "json_object"},
            },
            "response_format",
        ),
        ({"logit_bias": {"99999999": 1}}, "logit_bias"),
        ({"top_logprobs": 2}, None),
        ({"n": 17}, "n"),
    ],
)
def test_combinations_that_cannot_be_honoured_are_400s(client, extra, param) -> None:
    c = client("x")
    with pytest.raises(openai.BadRequestError) as err:
        c.chat.completions.create(model="scripted", messages=ASK, extra_body=extra)
    if param is not None:
        assert err.value.body["param"] == param


# A node whose required child is a node: only infinite documents match it.
ENDLESS = {
    "$defs": {
        "node": {
            "type": "object",
            "properties": {"child": {"$ref": "#/$defs/node"}},
            "required": ["child"],
        }
    },
    "$ref": "#/$defs/node",
}
# The same with the child optional (or a list): finite documents match it.
TREE = {
    "$defs": {
        "node": {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "children": {"type": "array", "items": {"$ref": "#/$defs/node"}},
            },
            "required": ["name", "children"],
            "additionalProperties": False,
        }
    },
    "$ref": "#/$defs/node",
}


@pytest.mark.parametrize(
    "schema",
    [
        ENDLESS,
        {"type": "object", "properties": {"again": {"$ref": "#"}}, "required": ["again"]},
        {"type": "array", "items": {"$ref": "#"}, "minItems": 1},
        # Finite at the root, endless in a branch a document may enter:
        {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/node"}], "$defs": ENDLESS["$defs"]},
    ],
)
def test_a_schema_that_recurses_without_end_is_a_400(client, schema) -> None:
    c = client('{"child": {"child": {}}}')
    fmt = {"type": "json_schema", "json_schema": {"name": "endless", "schema": schema}}
    with pytest.raises(openai.BadRequestError) as err:
        c.chat.completions.create(model="scripted", messages=ASK, response_format=fmt)
    body = err.value.body
    assert body["type"] == "invalid_request_error" and body["param"] == "response_format"
    assert "recurse without end" in body["message"]
    tool = {"type": "function", "function": {"name": "walk", "parameters": schema}}
    with pytest.raises(openai.BadRequestError) as err:
        c.chat.completions.create(
            model="scripted", messages=ASK, tools=[tool], tool_choice="required"
        )
    assert err.value.body["param"] == "tools" and "recurse without end" in err.value.body["message"]
    # With tool_choice "auto" no grammar is built: the schema only goes to the template.
    r = c.chat.completions.create(model="scripted", messages=ASK, tools=[tool])
    assert r.choices[0].finish_reason == "stop"


def test_a_recursive_schema_with_an_end_is_enforced(client) -> None:
    tree = '{"name": "root", "children": [{"name": "leaf", "children": []}]}'
    fmt = {"type": "json_schema", "json_schema": {"name": "tree", "schema": TREE}}
    r = client(tree).chat.completions.create(model="scripted", messages=ASK, response_format=fmt)
    assert r.choices[0].message.content == tree
    # As tool parameters, its "$ref"s still mean the parameters' own root (pydantic's
    # `$defs` layout), not the schema of the whole call it is wrapped in.
    call = f'<tool_call>\n{{"name": "plant", "arguments": {tree}}}\n</tool_call>'
    tool = {"type": "function", "function": {"name": "plant", "parameters": TREE}}
    r = client(call).chat.completions.create(
        model="scripted", messages=ASK, tools=[tool], tool_choice="required"
    )
    (made,) = r.choices[0].message.tool_calls
    assert json.loads(made.function.arguments) == json.loads(tree)
