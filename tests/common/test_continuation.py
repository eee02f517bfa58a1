"""A chat keyed as the continuation of its conversation's last request
(`warmfleet_common.continuation`) is exactly the chat keyed whole: tokens, cuts, message
starts, reply start and text, whatever the next request does to the conversation
(appends a turn or tool calls, edits or retypes an old message, changes the tools or
the template arguments, drops its last turn, repeats itself), on the embedded, a
thinking and a harmony template."""

from __future__ import annotations

import copy
import functools
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support.harmony import harmony_tokenizer
from support.thinking import thinking_tokenizer
from warmfleet_common.continuation import ChatState, ChatTurn, continuable, continue_chat
from warmfleet_common.prompts import PromptBuilder, PromptError
from warmfleet_daemon.models.loader import load_gguf_tokenizer_only

MAKERS = {
    "embedded": load_gguf_tokenizer_only,
    "thinking": thinking_tokenizer,
    "harmony": harmony_tokenizer,
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
]
OTHER_TOOLS = [{**TOOLS[0], "function": {**TOOLS[0]["function"], "description": "Read"}}]
# Fragments that merge with what comes before, and the templates' own special tokens.
FRAGMENTS = ["x", "X", " ", "  ", "\n", "\n\n", "\t", "1", "42", "é", "漢", "!", "<", "|"]
FRAGMENTS += ["<|im_start|>", "<|im_end|>", "<|start|>", "<|message|>", "<|end|>", "hello"]
text = st.lists(st.sampled_from(FRAGMENTS), min_size=0, max_size=6).map("".join)
step = st.one_of(
    st.tuples(st.just("turn"), text, text, st.booleans()),
    st.tuples(st.just("tool"), text, st.sampled_from(["call_1", "c2"])),
    st.tuples(st.just("edit"), st.integers(0, 40), text),
    st.tuples(st.just("retype"), st.integers(0, 40), st.sampled_from([1, 1.0, True, -0.0, 0.0])),
    st.tuples(st.just("tools"), st.sampled_from([None, TOOLS, OTHER_TOOLS])),
    st.tuples(st.just("kwargs"), st.sampled_from([None, {"enable_thinking": False}])),
    st.tuples(st.just("drop"), st.integers(1, 3)),
    st.tuples(
        st.just("same"),
    ),
)


@functools.cache
def builders(name: str) -> tuple[PromptBuilder, PromptBuilder]:
    """One builder that continues, one that keys whole (memos of their own)."""
    return PromptBuilder(MAKERS[name]()), PromptBuilder(MAKERS[name]())


def whole(builder: PromptBuilder, request: tuple[Any, Any, Any]) -> Any:
    messages, tools, kwargs = request
    try:
        r = builder.chat(copy.deepcopy(messages), tools, template_kwargs=kwargs)
    except (PromptError, TypeError, ValueError, KeyError) as exc:
        return type(exc)
    return (r.tokens, r.cuts, r.message_starts, r.reply_start, r.text)


def continued(
    builder: PromptBuilder, request: tuple[Any, Any, Any], prior: ChatState | None
) -> tuple[Any, ChatTurn | None, ChatState | None]:
    messages, tools, kwargs = request
    try:
        turn, state = continue_chat(builder, copy.deepcopy(messages), tools, kwargs, prior)
    except (PromptError, TypeError, ValueError, KeyError) as exc:
        return type(exc), None, prior
    found = (tuple(turn.tokens), turn.cuts, turn.message_starts, turn.reply_start, turn.text)
    return found, turn, state


def apply(op: tuple[Any, ...], messages: list[dict[str, Any]], request: dict[str, Any]) -> None:
    kind = op[0]
    if kind == "turn":
        answer: dict[str, Any] = {"role": "assistant", "content": op[1]}
        if op[3]:
            answer["reasoning_content"] = "think " + op[1]
        messages += [answer, {"role": "user", "content": op[2] or "go"}]
    elif kind == "tool":
        function = {"name": "read_file", "arguments": '{"path": "a"}'}
        call = {"id": op[2], "type": "function", "function": function}
        messages += [
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": op[2], "content": op[1]},
        ]
    elif kind == "edit" and messages:
        messages[op[1] % len(messages)]["content"] = op[2]
    elif kind == "retype" and messages:
        messages[op[1] % len(messages)]["n"] = op[2]
    elif kind == "tools":
        request["tools"] = op[1]
    elif kind == "kwargs":
        request["kwargs"] = op[1]
    elif kind == "drop" and len(messages) > op[1] + 1:
        del messages[-op[1] :]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    name=st.sampled_from(sorted(MAKERS)),
    system=st.booleans(),
    first=text,
    steps=st.lists(step, min_size=1, max_size=8),
)
def test_a_continued_chat_is_the_chat_keyed_whole(
    name: str, system: bool, first: str, steps: list[tuple[Any, ...]]
) -> None:
    mine, reference = builders(name)
    messages: list[dict[str, Any]] = []
    if system:
        messages.append({"role": "system", "content": "Be terse.\n"})
    messages.append({"role": "user", "content": first or "hi"})
    request: dict[str, Any] = {"tools": None, "kwargs": None}
    prior: ChatState | None = None
    for op in [("same",), *steps]:
        apply(op, messages, request)
        asked = (messages, request["tools"], request["kwargs"])
        found, _, prior = continued(mine, asked, prior)
        assert found == whole(reference, asked), op


def agent_turns(count: int) -> list[list[dict[str, Any]]]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent. " * 40},
        {"role": "user", "content": "Fix the failing test"},
    ]
    turns = []
    for turn in range(count):
        messages += [
            {"role": "assistant", "content": f"Step {turn}: looked at the file. " * 8},
            {"role": "user", "content": f"ok {turn}"},
        ]
        turns.append(copy.deepcopy(messages))
    return turns


def test_a_turn_reuses_what_its_last_request_tokenized() -> None:
    builder, _ = builders("embedded")
    assert continuable(builder)
    prior: ChatState | None = None
    previous = 0
    for messages in agent_turns(6):
        turn, prior = continue_chat(builder, messages, TOOLS, None, prior)
        assert turn.reused >= previous - 8  # backed off only to the last added token it reads
        previous = len(turn.tokens)
    assert previous > 600


def test_an_edited_history_or_other_tools_is_keyed_whole() -> None:
    builder, _ = builders("embedded")
    first, second = agent_turns(2)
    _, prior = continue_chat(builder, first, TOOLS, None, None)
    edited = copy.deepcopy(second)
    edited[2]["content"] = "Step 0: changed."
    assert continue_chat(builder, edited, TOOLS, None, prior)[0].reused < 20
    assert continue_chat(builder, second, OTHER_TOOLS, None, prior)[0].reused == 0
    retyped = copy.deepcopy(second)
    retyped[1]["n"], first[1]["n"] = True, 1  # equal in Python, not as JSON
    _, prior = continue_chat(builder, first, TOOLS, None, None)
    assert continue_chat(builder, retyped, TOOLS, None, prior)[0].reused == 0
