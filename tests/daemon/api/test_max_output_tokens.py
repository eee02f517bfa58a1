"""`--max-output-tokens N`: no response runs longer, whatever its request asks or leaves
open (Codex sends no `max_output_tokens`; Claude Code asks for 32,000), and a response
cut there ends as cut by its own limit on every API."""

from __future__ import annotations

from collections.abc import Iterator

import anthropic
import openai
import pytest

from support.engine import model
from support.scripted import NAME, scripted_engine, serve

SCRIPT = "one two three four five six seven eight nine ten eleven twelve"
CEILING = 4
ASK = [{"role": "user", "content": "Count."}]


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    engine = scripted_engine(model("tiny-random").tokenizer, SCRIPT)
    with serve(engine, max_output_tokens=CEILING) as base:
        yield base


@pytest.fixture(scope="module")
def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


@pytest.mark.parametrize("asked", [None, 2, CEILING, 1000])
def test_chat_completions(client: openai.OpenAI, asked: int | None) -> None:
    r = client.chat.completions.create(model=NAME, messages=ASK, max_tokens=asked)  # type: ignore[arg-type]
    assert r.usage is not None
    assert r.usage.completion_tokens == min(asked or CEILING, CEILING)
    assert r.choices[0].finish_reason == "length"


def test_completions(client: openai.OpenAI) -> None:
    r = client.completions.create(model=NAME, prompt="Count:", max_tokens=1000)
    assert r.usage is not None and r.usage.completion_tokens == CEILING
    assert r.choices[0].finish_reason == "length"


@pytest.mark.parametrize("stream", [False, True])
def test_responses_without_a_limit(client: openai.OpenAI, stream: bool) -> None:
    if stream:
        with client.responses.stream(model=NAME, input="Count.") as events:
            r = events.get_final_response()
    else:
        r = client.responses.create(model=NAME, input="Count.")
    assert r.usage is not None and r.usage.output_tokens == CEILING
    assert r.status == "incomplete" and r.incomplete_details is not None
    assert r.incomplete_details.reason == "max_output_tokens"


def test_anthropic_messages_asking_for_more(url: str) -> None:
    client = anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0)
    with client.messages.stream(model=NAME, max_tokens=32000, messages=ASK) as stream:  # type: ignore[arg-type]
        r = stream.get_final_message()
    assert r.usage.output_tokens == CEILING and r.stop_reason == "max_tokens"
