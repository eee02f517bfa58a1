"""The API shapes a request or a warm prompt comes in, as one registry: OpenAI's chat
completions, Anthropic's Messages API (Claude Code) and OpenAI's Responses API (Codex).

Each entry holds what the components know of a shape by its name: the warm prompt
field (`contract.WarmPrompt`, and a WarmPromptSet's prompts) that holds a prompt in it,
the WarmPromptSet prompt field that takes that content from a ConfigMap key (the
operator resolves it), and the route its requests go to (the capture endpoint serves
it, the router proxies it and answers its errors in its shape). Everything that lists
the shapes reads this; a new shape is an entry here, its prompt model in `WarmPrompt`,
its translation to chat in this package, and its fields in the CRD (crds/). Plain data,
imported by `contract`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal

ApiName = Literal["chat", "anthropic", "responses"]


@dataclass(frozen=True)
class ApiShape:
    name: ApiName  # as warm prompts, captures and the router's routes name it
    title: str  # as messages name it
    prompt_field: str  # the warm prompt field holding a prompt in this shape
    configmap_field: str  # the WarmPromptSet prompt field naming a ConfigMap key with it
    path: str  # the route requests in this shape are sent to


SHAPES: Final[Mapping[ApiName, ApiShape]] = {
    "chat": ApiShape(
        "chat", "chat completions", "messages", "messagesFrom", "/v1/chat/completions"
    ),
    "anthropic": ApiShape(
        "anthropic", "the Messages API", "anthropic", "anthropicFrom", "/v1/messages"
    ),
    "responses": ApiShape(
        "responses", "the Responses API", "responses", "responsesFrom", "/v1/responses"
    ),
}
