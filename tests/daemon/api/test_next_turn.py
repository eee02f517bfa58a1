"""The next turn's prefix is cached before the next turn arrives, through each API:
after a response (text, or tool calls), the daemon prefills the conversation plus the
answer as the API returned it, up to where the next message's content starts, at idle
priority; the second turn then reuses the first turn's prompt and answer whole."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from support.engine import model
from support.scripted import scripted_engine, serve

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
SCRIPT = f"Let me check the weather for you.\n{CALL}"
SYSTEM = "You are a weather bot for the whole of Europe. " * 6
ASK = "What is the weather in Paris?"
PARAMETERS = {"type": "object", "properties": {"city": {"type": "string"}}}


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with serve(scripted_engine(model("tiny-random").tokenizer, SCRIPT)) as base:
        yield base


def settle(url: str) -> dict[str, Any]:
    """Wait until the daemon has no next-turn work left; its next_turn status."""
    deadline = time.monotonic() + 30
    while True:
        status = httpx.get(f"{url}/v1/status").json()
        if status["next_turn"]["pending"] == 0 and status["engine"]["idle_waiting"] == 0:
            return dict(status["next_turn"])
        assert time.monotonic() < deadline, status["next_turn"]
        time.sleep(0.05)


def post(url: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """The response object; from a stream, the one its last events carry."""
    if not body.get("stream"):
        r = httpx.post(f"{url}{path}", json=body, timeout=60)
        assert r.status_code == 200, r.text
        return dict(r.json())
    events = []
    with httpx.stream("POST", f"{url}{path}", json=body, timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[len("data: ") :]))
    return _from_stream(path, events)


def _from_stream(path: str, events: list[dict[str, Any]]) -> dict[str, Any]:
    if path == "/v1/responses":
        return dict(events[-1]["response"])
    if path == "/v1/messages":
        start = events[0]["message"]
        blocks: list[dict[str, Any]] = []
        for e in events:
            if e["type"] == "content_block_start":
                blocks.append(dict(e["content_block"]))
            elif e["type"] == "content_block_delta":
                delta = e["delta"]
                if delta["type"] == "text_delta":
                    blocks[-1]["text"] += delta["text"]
                elif delta["type"] == "input_json_delta":
                    blocks[-1]["input"] = json.loads(delta["partial_json"])
        usage = {**start["usage"], **events[-2]["usage"]}
        return {"content": blocks, "usage": usage}
    content, calls = "", []
    for e in events:
        for choice in e.get("choices") or []:
            content += choice["delta"].get("content") or ""
            for call in choice["delta"].get("tool_calls") or []:
                calls.append({k: v for k, v in call.items() if k != "index"})
    message: dict[str, Any] = {"role": "assistant", "content": content or None}
    if calls:
        message["tool_calls"] = calls
    return {"choices": [{"message": message}], "usage": events[-1]["usage"]}


class Chat:
    path = "/v1/chat/completions"

    def first(self, tools: bool, stream: bool) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": "scripted",
            "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": ASK}],
            "max_tokens": 100,
            "stream": stream,
        }
        if stream:
            body["stream_options"] = {"include_usage": True}
        if tools:
            function = {"name": "get_weather", "parameters": PARAMETERS}
            body["tools"] = [{"type": "function", "function": function}]
        return body

    def second(self, body: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
        message = answer["choices"][0]["message"]
        message = {k: v for k, v in message.items() if k in ("role", "content", "tool_calls")}
        calls = message.get("tool_calls") or []
        following = (
            [{"role": "tool", "tool_call_id": c["id"], "content": "18°C, sunny"} for c in calls]
            if calls
            else [{"role": "user", "content": "Thanks! And in Rome?"}]
        )
        return {**body, "messages": [*body["messages"], message, *following]}

    def usage(self, answer: dict[str, Any]) -> tuple[int, int, int]:
        u = answer["usage"]
        cached = u["prompt_tokens_details"]["cached_tokens"]
        return u["prompt_tokens"], u["completion_tokens"], cached

    def called(self, answer: dict[str, Any]) -> bool:
        return bool(answer["choices"][0]["message"].get("tool_calls"))


class Messages:
    path = "/v1/messages"

    def first(self, tools: bool, stream: bool) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": "scripted",
            "system": SYSTEM,
            "messages": [{"role": "user", "content": ASK}],
            "max_tokens": 100,
            "stream": stream,
        }
        if tools:
            body["tools"] = [{"name": "get_weather", "input_schema": PARAMETERS}]
        return body

    def second(self, body: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
        blocks = answer["content"]
        results = [
            {"type": "tool_result", "tool_use_id": b["id"], "content": "18°C, sunny"}
            for b in blocks
            if b["type"] == "tool_use"
        ]
        following = results or [{"type": "text", "text": "Thanks! And in Rome?"}]
        history = [{"role": "assistant", "content": blocks}, {"role": "user", "content": following}]
        return {**body, "messages": [*body["messages"], *history]}

    def usage(self, answer: dict[str, Any]) -> tuple[int, int, int]:
        u = answer["usage"]
        prompt = u["input_tokens"] + u["cache_read_input_tokens"] + u["cache_creation_input_tokens"]
        return prompt, u["output_tokens"], u["cache_read_input_tokens"]

    def called(self, answer: dict[str, Any]) -> bool:
        return any(b["type"] == "tool_use" for b in answer["content"])


class Responses:
    path = "/v1/responses"

    def first(self, tools: bool, stream: bool) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": "scripted",
            "instructions": SYSTEM,
            "input": [{"type": "message", "role": "user", "content": ASK}],
            "max_output_tokens": 100,
            "stream": stream,
            "store": False,
        }
        if tools:
            body["tools"] = [{"type": "function", "name": "get_weather", "parameters": PARAMETERS}]
        return body

    def second(self, body: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
        output = answer["output"]
        results = [
            {"type": "function_call_output", "call_id": i["call_id"], "output": "18°C, sunny"}
            for i in output
            if i["type"] == "function_call"
        ]
        following = results or [{"type": "message", "role": "user", "content": "And in Rome?"}]
        return {**body, "input": [*body["input"], *output, *following]}

    def usage(self, answer: dict[str, Any]) -> tuple[int, int, int]:
        u = answer["usage"]
        return u["input_tokens"], u["output_tokens"], u["input_tokens_details"]["cached_tokens"]

    def called(self, answer: dict[str, Any]) -> bool:
        return any(i["type"] == "function_call" for i in answer["output"])


@pytest.mark.parametrize("api", [Chat(), Messages(), Responses()], ids=lambda a: a.path)
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("tools", [False, True], ids=["text", "tool-call"])
def test_the_second_turn_reuses_the_first_turn_and_its_answer(
    url: str, api: Any, stream: bool, tools: bool
) -> None:
    httpx.delete(f"{url}/v1/cache/prefix")
    settle(url)
    body = api.first(tools, stream)
    first = post(url, api.path, body)
    assert api.called(first) == tools
    before = settle(url)
    prompt, completion, _ = api.usage(first)

    second = post(url, api.path, api.second(body, first))
    prompt2, _, cached = api.usage(second)
    # The whole first turn, answer included, and the next message's header were cached:
    # the reuse = cached / (previous prompt + previous completion).
    assert cached / (prompt + completion) >= 0.98, (prompt, completion, cached)
    assert cached < prompt2
    assert before["prefilled"] >= 1 and before["skipped"] == 0
