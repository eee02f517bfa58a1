"""OpenAI-compatible request and response bodies (the subset the daemon serves)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from warmfleet_common.contract import ChatMessage, ToolDefinition
from warmfleet_common.tiers import Tier


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool = False


class JsonSchemaFormat(BaseModel):
    name: str = Field("response", max_length=64)
    description: str | None = None
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    """`text`, `json_object` (any JSON object) or `json_schema`: enforced while decoding."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("json_schema is required when type is json_schema")
        return self


class NamedFunction(BaseModel):
    name: str = Field(min_length=1, max_length=128)


class NamedToolChoice(BaseModel):
    type: Literal["function"]
    function: NamedFunction


class _SamplingFields(BaseModel):
    # Parameters not declared here are refused with a 400 naming them (never ignored).
    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    max_tokens: int | None = Field(None, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=0, lt=2**64, description="0 <= seed < 2**64")
    n: int = Field(1, ge=1, le=16, description="choices per request; they share the prompt's cache")
    ignore_eos: bool = False  # vLLM extension: generate exactly max_tokens
    user: str | None = Field(None, max_length=256, description="recorded in the daemon's logs")
    logit_bias: dict[str, float] | None = Field(None, max_length=1024)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    repetition_penalty: float | None = Field(None, gt=0.0, le=2.0)  # vLLM extension
    store: bool | None = Field(None, description="false or null: nothing is stored")
    cache_salt: str | None = Field(
        None,
        min_length=1,
        max_length=256,
        description="vLLM's: this request's cache blocks are keyed apart from every request "
        "without the same salt (isolation within a tenant)",
    )

    @field_validator("store")
    @classmethod
    def _nothing_stored(cls, value: bool | None) -> bool | None:
        if value:
            raise ValueError("this server does not store completions")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _bias_values(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        for token, bias in (value or {}).items():
            if not token.isdigit():
                raise ValueError(f"keys must be token ids; got {token!r}")
            if not -100.0 <= bias <= 100.0:
                raise ValueError(f"biases must be in [-100, 100]; got {bias}")
        return value

    @field_validator("stop")
    @classmethod
    def _bounded_stops(cls, value: str | list[str] | None) -> str | list[str] | None:
        stops = [value] if isinstance(value, str) else value or []
        if len(stops) > 16 or any(len(s) > 256 for s in stops):
            raise ValueError("at most 16 stop strings of at most 256 characters")
        return value

    def stop_list(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[ToolDefinition] | None = Field(None, max_length=128)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = False
    top_logprobs: int | None = Field(None, ge=0, le=20)

    @model_validator(mode="after")
    def _top_logprobs_need_logprobs(self) -> ChatCompletionRequest:
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        return self


class CompletionRequest(_SamplingFields):
    prompt: str | list[int] | list[str] | list[list[int]]
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=20)
    suffix: str | None = None

    @field_validator("echo", "suffix")
    @classmethod
    def _unsupported(cls, value: Any) -> Any:
        if value:
            raise ValueError("echo and suffix are not supported")
        return value

    def single_prompt(self) -> str | list[int]:
        prompt = self.prompt
        if isinstance(prompt, str):
            return prompt
        if prompt and all(isinstance(t, int) for t in prompt):
            return [int(t) for t in prompt]  # type: ignore[arg-type]
        if len(prompt) == 1:
            only = prompt[0]
            return only if isinstance(only, str) else [int(t) for t in only]  # type: ignore[union-attr]
        raise ValueError("only one prompt per request is supported")


class PromptTokensDetails(BaseModel):
    cached_tokens: int


class UsageInfo(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails
    # A warmfleet extension: the cached prompt tokens by the tier they came from
    # (restored from RAM, read back from the disk tier, copied from a peer on a spill).
    cached_tokens_by_tier: dict[Tier, int] | None = None


class FunctionCall(BaseModel):
    name: str
    arguments: str  # a JSON document, as OpenAI sends it


class ToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprobInfo(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprobInfo] | None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    # vLLM's field: what a reasoning model wrote between its thinking markers.
    reasoning_content: str | None = None
    tool_calls: list[ToolCall] | None = None


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: str | None
    logprobs: ChoiceLogprobs | None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: UsageInfo
    system_fingerprint: str | None = None


class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]] | None
    text_offset: list[int]


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    finish_reason: str | None
    logprobs: CompletionLogprobs | None = None


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo
    system_fingerprint: str | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "warmfleet"
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
