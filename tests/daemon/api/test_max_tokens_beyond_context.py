"""A client that asks for more tokens than the context leaves (opencode asks for 32,000
on every request, whatever the model) gets an answer that runs to the context's end and
finishes as cut by its length, on every route; only a prompt that itself does not fit is
refused, with OpenAI's `context_length_exceeded`."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import httpx
import openai
import pytest

from support.engine import model
from support.processes import serving
from warmfleet_daemon.api.app import create_app
from warmfleet_daemon.engine.core import Engine
from warmfleet_daemon.engine.requests import EngineConfig
from warmfleet_daemon.settings import DaemonSettings

CONTEXT = 256
ASK = [{"role": "user", "content": "Tell me everything."}]


@pytest.fixture(scope="module")
def client() -> Iterator[openai.OpenAI]:
    loaded = dataclasses.replace(model("tiny-random"), context_length=CONTEXT)
    engine = Engine(loaded, EngineConfig(block_size=32, cache_budget_bytes=64 << 20))
    settings = DaemonSettings(model="tiny-random", default_temperature=0.0)
    with serving(create_app(settings, engine=engine)) as url:
        yield openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


def test_chat_completions(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model="tiny-random",
        messages=ASK,  # type: ignore[arg-type]
        max_tokens=32000,
        extra_body={"ignore_eos": True},
    )
    assert r.choices[0].finish_reason == "length"
    assert r.usage is not None and r.usage.total_tokens == CONTEXT


def test_chat_completions_streamed_with_max_completion_tokens(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="tiny-random",
        messages=ASK,  # type: ignore[arg-type]
        max_completion_tokens=32000,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices]
    usage = chunks[-1].usage
    assert finish[-1] == "length" and usage is not None and usage.total_tokens == CONTEXT


def test_completions(client: openai.OpenAI) -> None:
    r = client.completions.create(
        model="tiny-random",
        prompt="Once upon a time",
        max_tokens=32000,
        extra_body={"ignore_eos": True},
    )
    assert r.choices[0].finish_reason == "length"
    assert r.usage is not None and r.usage.total_tokens == CONTEXT


def test_responses(client: openai.OpenAI) -> None:
    r = client.responses.create(
        model="tiny-random", input="Tell me everything.", max_output_tokens=32000
    )
    # The Responses API has no ignore_eos: greedy decoding of the tiny random model (its
    # weights are seeded) runs this prompt to the context's end, so the cut is asserted
    # every time; a model that ended its answer early would fail here, not pass.
    assert r.status == "incomplete"
    assert r.incomplete_details is not None
    assert r.incomplete_details.reason == "max_output_tokens"
    assert r.usage is not None and r.usage.total_tokens == CONTEXT


def test_anthropic_messages(client: openai.OpenAI) -> None:
    """Without ignore_eos too (the Messages API has none): greedy runs to the end."""
    r = httpx.post(
        f"{str(client.base_url).removesuffix('/v1/')}/v1/messages",
        json={
            "model": "tiny-random",
            "max_tokens": 32000,
            "messages": ASK,
        },
        timeout=120,
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["stop_reason"] == "max_tokens"
    usage = body["usage"]  # Anthropic counts cached input apart from input_tokens
    prompt = usage["input_tokens"] + usage.get("cache_read_input_tokens", 0)
    assert prompt + usage.get("cache_creation_input_tokens", 0) + usage["output_tokens"] == CONTEXT


def test_a_prompt_that_does_not_fit_is_refused(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(
            model="tiny-random",
            messages=[{"role": "user", "content": "word " * CONTEXT}],
            max_tokens=1,
        )
    error = refused.value.body
    assert isinstance(error, dict)
    assert (error["code"], error["param"]) == ("context_length_exceeded", "messages")
