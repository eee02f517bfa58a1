"""Multi-turn sessions of the four coding agents, request by request, as each agent
builds them: its recorded first request (tests/support/data), then the assistant's reply
appended as the agent sends it back and the next tool result or user message, turn after
turn. Each request is translated to chat-template messages by the daemon's own code (the
Anthropic and Responses translations, the chat completions message model), so a test can
render every turn with a model's template and compare the prompts.

What each agent adds after its first request:
- Claude Code: tool_use blocks and tool_result blocks, a `system`-role message after the
  user's next words (its reminders), as its first request does with its environment;
- Codex: function_call and function_call_output items, assistant messages, and a
  `developer` message mid-conversation (a permissions update) before the user's words;
- Qwen Code: an assistant message with `content: null` and tool calls, tool results as
  text parts, user messages as text parts (as its recording shows);
- opencode: an assistant message with `content: ""` and tool calls, tool results as
  strings. Its title request (a system prompt and two user messages) is a single turn.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from warmfleet_common.agent_apis.anthropic import MessagesRequest
from warmfleet_common.agent_apis.responses import ResponsesRequest
from warmfleet_common.contract import ChatMessage, ToolDefinition

DATA = Path(__file__).with_name("data")


@dataclass(frozen=True)
class Turn:
    """One request as the chat template sees it."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    template_kwargs: dict[str, Any]


def _body(name: str) -> dict[str, Any]:
    return copy.deepcopy(json.loads((DATA / name).read_text())["body"])


def _anthropic(body: dict[str, Any]) -> Turn:
    request = MessagesRequest.model_validate(body)
    chat = request.chat()
    return Turn(chat.messages, chat.tools, chat.template_kwargs(request.options()))


def _responses(body: dict[str, Any]) -> Turn:
    request = ResponsesRequest.model_validate(body)
    chat = request.chat()
    return Turn(chat.messages, chat.tools, chat.template_kwargs(request.options()))


def _chat(body: dict[str, Any]) -> Turn:
    """As the daemon's chat completions route renders a body."""
    messages = [ChatMessage.model_validate(m).as_template_message() for m in body["messages"]]
    tools = [ToolDefinition.model_validate(t).model_dump(exclude_none=True) for t in body["tools"]]
    return Turn(messages, tools or None, {})


def claude_code() -> list[Turn]:
    body = _body("claude-code-2.1.332.json")
    turns = [_anthropic(body)]
    steps: list[list[dict[str, Any]]] = [
        [
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "", "signature": ""},
                    {"type": "text", "text": "I'll list the files."},
                    {
                        "type": "tool_use",
                        "id": "toolu_01",
                        "name": "Bash",
                        "input": {"command": "ls"},
                    },
                ],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "toolu_01", "content": "a.txt"}],
            },
        ],
        [
            {"role": "assistant", "content": [{"type": "text", "text": "There is one: a.txt."}]},
            {"role": "user", "content": [{"type": "text", "text": "Show it, then fix the typo."}]},
            {
                "role": "system",
                "content": [
                    {
                        "type": "text",
                        "text": "<system-reminder>\nThe task tools haven't been used recently. "
                        "If you are working on tasks that would benefit from tracking progress, "
                        "consider using them.\n</system-reminder>",
                    }
                ],
            },
        ],
        [
            {
                "role": "assistant",
                "content": [
                    {
                        "type": "tool_use",
                        "id": "toolu_02",
                        "name": "Read",
                        "input": {"path": "a.txt"},
                    }
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_02", "content": "helo world"}
                ],
            },
        ],
        [
            {"role": "assistant", "content": [{"type": "text", "text": "It says 'helo world'."}]},
            {"role": "user", "content": [{"type": "text", "text": "Thanks."}]},
        ],
    ]
    for step in steps:
        body["messages"] += step
        turns.append(_anthropic(copy.deepcopy(body)))
    return turns


def codex() -> list[Turn]:
    body = _body("codex-0.171.0.json")
    turns = [_responses(body)]

    def message(role: str, text: str) -> dict[str, Any]:
        kind = "output_text" if role == "assistant" else "input_text"
        return {"type": "message", "role": role, "content": [{"type": kind, "text": text}]}

    def call(call_id: str, name: str, arguments: dict[str, Any], output: str) -> list[Any]:
        return [
            {
                "type": "function_call",
                "call_id": call_id,
                "name": name,
                "arguments": json.dumps(arguments),
            },
            {"type": "function_call_output", "call_id": call_id, "output": output},
        ]

    steps: list[list[dict[str, Any]]] = [
        call("call_1", "exec_command", {"cmd": "ls"}, "a.txt"),
        [
            message("assistant", "There is one: a.txt."),
            message(
                "developer",
                "<permissions instructions>\nApproval policy is now never: run commands "
                "without asking.\n</permissions instructions>",
            ),
            message("user", "Show it, then fix the typo."),
        ],
        call("call_2", "exec_command", {"cmd": "cat a.txt"}, "helo world"),
        [message("assistant", "It says 'helo world'."), message("user", "Thanks.")],
    ]
    for step in steps:
        body["input"] += step
        turns.append(_responses(copy.deepcopy(body)))
    return turns


def _chat_session(
    name: str, call_content: str | None, result: Callable[[str], Any], user: Callable[[str], Any]
) -> list[Turn]:
    body = _body(name)
    turns = [_chat(body)]

    def call(call_id: str, tool: str, arguments: dict[str, Any], output: str) -> list[Any]:
        function = {"name": tool, "arguments": json.dumps(arguments)}
        return [
            {
                "role": "assistant",
                "content": call_content,
                "tool_calls": [{"id": call_id, "type": "function", "function": function}],
            },
            {"role": "tool", "tool_call_id": call_id, "content": result(output)},
        ]

    names = [t["function"]["name"] for t in body["tools"]]
    glob, read = "glob", "read_file" if "read_file" in names else "read"
    steps = [
        call("call_1", glob, {"pattern": "*"}, "a.txt"),
        [
            {"role": "assistant", "content": "There is one: a.txt."},
            {"role": "user", "content": user("Show it, then fix the typo.")},
        ],
        call("call_2", read, {"path": "a.txt"}, "helo world"),
        [
            {"role": "assistant", "content": "It says 'helo world'."},
            {"role": "user", "content": user("Thanks.")},
        ],
    ]
    for step in steps:
        body["messages"] += step
        turns.append(_chat(copy.deepcopy(body)))
    return turns


def _parts(text: str) -> list[dict[str, str]]:
    return [{"type": "text", "text": text}]


def qwen_code() -> list[Turn]:
    return _chat_session("qwen-code-0.24.4.json", None, _parts, _parts)


def opencode() -> list[Turn]:
    return _chat_session("opencode-1.18.33.json", "", str, str)


def opencode_title() -> list[Turn]:
    body = _body("opencode-1.18.33-title.json")
    return [_chat({**body, "tools": []})]


AGENTS: dict[str, Callable[[], list[Turn]]] = {
    "Claude Code": claude_code,
    "Codex": codex,
    "Qwen Code": qwen_code,
    "opencode": opencode,
}
