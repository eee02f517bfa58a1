"""The official `openai` client against a real daemon on the embedded model."""

from __future__ import annotations

import openai
import pytest

SYSTEM = (
    "You are Atlas, the on-call assistant of the platform team. You answer questions "
    "about Kubernetes, Helm and Grafana briefly and precisely. " * 6
)


@pytest.fixture(scope="module")
def client(embedded_daemon) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{embedded_daemon.url}/v1", api_key="unused", max_retries=0)


def test_chat_answers(client) -> None:
    r = client.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        temperature=0,
        max_tokens=30,
    )
    assert "Paris" in r.choices[0].message.content
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.prompt_tokens > 10 and r.usage.completion_tokens > 0


def test_second_request_sharing_a_system_prompt_reports_cached_tokens(client) -> None:
    def ask(question: str):
        return client.chat.completions.create(
            model="SmolLM2-135M-Instruct",
            messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
            temperature=0,
            max_tokens=12,
        )

    first = ask("What is a Helm chart?")
    second = ask("What does kubectl apply do?")
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached > 0.8 * first.usage.prompt_tokens  # the whole system prompt
    assert cached < second.usage.prompt_tokens


def test_streaming_chat_with_usage(client) -> None:
    stream = client.chat.completions.create(
        model="default",
        messages=[
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": "Name a Grafana panel type."},
        ],
        temperature=0,
        max_tokens=16,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip()
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens > 0
    assert usage.prompt_tokens_details.cached_tokens > 0


def test_completions_and_models(client) -> None:
    assert [m.id for m in client.models.list().data] == ["SmolLM2-135M-Instruct"]
    r = client.completions.create(model="default", prompt="The sky is", max_tokens=5, temperature=0)
    assert r.choices[0].text and r.usage.completion_tokens <= 5


def test_errors_surface_as_openai_exceptions(client) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="default", messages=[], max_tokens=1)
    assert "messages" in str(err.value)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(
            model="gpt-9", messages=[{"role": "user", "content": "x"}], max_tokens=1
        )


RELEASE = {
    "type": "object",
    "properties": {
        "service": {"type": "string", "maxLength": 40},
        "replicas": {"type": "integer", "minimum": 1, "maximum": 10},
        "canary": {"type": "boolean"},
    },
    "required": ["service", "replicas", "canary"],
    "additionalProperties": False,
}


@pytest.mark.embedded
def test_the_embedded_model_writes_valid_json_under_a_json_schema(client) -> None:
    import json

    import jsonschema

    r = client.chat.completions.create(
        model="default",
        messages=[
            {"role": "system", "content": "You describe deployments as JSON."},
            {"role": "user", "content": "Deploy the checkout service with 3 replicas, no canary."},
        ],
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "release", "schema": RELEASE, "strict": True},
        },
        temperature=0,
        max_tokens=80,
    )
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(r.choices[0].message.content), RELEASE)


@pytest.mark.embedded
def test_the_embedded_model_calls_a_tool_when_required(client) -> None:
    import json

    tool = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The current weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 40}},
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    }
    r = client.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=[tool],
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=0,
        max_tokens=60,
    )
    assert r.choices[0].finish_reason == "tool_calls"
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "get_weather"
    assert isinstance(json.loads(call.function.arguments)["city"], str)
