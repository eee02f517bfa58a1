"""Tool calls: the model family's call format (mlx-lm's tool parsers), parsed out of the
generated text as it streams, and the grammar that forces a call (`tool_choice`
`required` or a named function)."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from mlx_lm.generate import TextStateMachine
from mlx_lm.tool_parsers import json_tools

from warmfleet_daemon.engine.grammar import JSON_OPTIONS

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ToolFormat:
    start: str  # the text that opens a call, e.g. "<tool_call>"
    end: str
    parse: Callable[[str, Any], Any]  # mlx-lm's parse_tool_call(text, tools)
    json_calls: bool  # `start {"name": ..., "arguments": {...}} end`: a grammar can force it


def tool_format(tokenizer: Any) -> ToolFormat:
    """The format mlx-lm found for this model; otherwise the Hermes `<tool_call>` JSON
    convention, which is what the daemon asks templates without tool support for."""
    if getattr(tokenizer, "has_tool_calling", False):
        parse = tokenizer.tool_parser
        return ToolFormat(
            tokenizer.tool_call_start,
            tokenizer.tool_call_end,
            parse,
            parse is json_tools.parse_tool_call,
        )
    return ToolFormat(
        json_tools.tool_call_start, json_tools.tool_call_end, json_tools.parse_tool_call, True
    )


def forced_call_grammar(
    fmt: ToolFormat, functions: Sequence[dict[str, Any]], *, parallel: bool
) -> str:
    """Lark (llguidance) for one call of one of `functions` (OpenAI function objects),
    or several in a row when `parallel`; each call's arguments follow the function's
    parameter schema."""
    bodies = [
        {
            "type": "object",
            "properties": {
                "name": {"const": f["name"]},
                "arguments": _own_document(f.get("parameters") or {"type": "object"}, i),
            },
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for i, f in enumerate(functions)
    ]
    schema = {"anyOf": bodies, "x-guidance": JSON_OPTIONS}
    repeat = ' ("\\n" call)*' if parallel else ""
    return (
        f"start: call{repeat}\n"
        f'call: {json.dumps(fmt.start)} "\\n" body "\\n" {json.dumps(fmt.end)}\n'
        f"body: %json {json.dumps(schema)}\n"
    )


def _own_document(parameters: dict[str, Any], index: int) -> dict[str, Any]:
    """The parameter schema with an `$id`, so its local `$ref`s ("#", "#/$defs/...", as
    pydantic writes them) still mean its own root once it is inside the call's schema."""
    if "$id" in parameters:
        return parameters
    return {"$id": f"urn:warmfleet:tool-parameters:{index}", **parameters}


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


class ToolCallParser:
    """Splits streamed text into content and tool calls (OpenAI's shape). Calls that
    do not parse are given back as content: nothing the model wrote is lost."""

    def __init__(self, fmt: ToolFormat, tools: list[dict[str, Any]] | None) -> None:
        self._fmt = fmt
        self._tools = tools
        machine = TextStateMachine({"normal": [(fmt.start, "tool")], "tool": [(fmt.end, "normal")]})
        self._state = machine.make_state("normal")
        self._previous = "normal"
        self._call_text = ""
        self.calls = 0  # calls parsed so far

    def feed(self, text: str) -> tuple[str, list[dict[str, Any]]]:
        """Content safe to emit, and the calls completed by `text`."""
        self._state, segments = TextStateMachine.split(self._state, text)
        return self._segments(segments)

    def finish(self) -> tuple[str, list[dict[str, Any]]]:
        """What is left when generation ends: a held-back marker prefix, or a call the
        model did not close (parsed if it can be)."""
        self._state, rest, current = TextStateMachine.flush(self._state)
        content, calls = self._segments([(current, rest)])
        if current == "tool" and self._call_text:
            more, text = self._parse(_without_partial(self._call_text, self._fmt.end), closed=False)
            if not more:  # give back exactly what the model wrote
                text = self._fmt.start + self._call_text
            calls.extend(more)
            content += text
            self._call_text = ""
        return content, calls

    def _segments(self, segments: list[tuple[str, str]]) -> tuple[str, list[dict[str, Any]]]:
        content, calls = "", []
        for state, text in segments:
            if state == "tool":
                self._call_text += text
            elif state == "normal":
                if self._previous == "tool":
                    more, raw = self._parse(self._call_text, closed=True)
                    calls.extend(more)
                    content += raw
                    self._call_text = ""
                content += text
            self._previous = state
        return content, calls

    def _parse(self, text: str, *, closed: bool) -> tuple[list[dict[str, Any]], str]:
        raw = self._fmt.start + text + (self._fmt.end if closed else "")
        try:
            parsed = self._fmt.parse(text, self._tools)
        except Exception as exc:  # a malformed call is the model's output, not a server error
            log.info("tool call not parsed (%s); returned as content", exc)
            return [], raw
        out = []
        for call in parsed if isinstance(parsed, list) else [parsed]:
            if not isinstance(call, dict) or not isinstance(call.get("name"), str):
                return [], raw
            arguments = call.get("arguments", {})
            out.append(
                {
                    "id": call.get("id") or new_call_id(),
                    "type": "function",
                    "function": {
                        "name": call["name"],
                        "arguments": arguments
                        if isinstance(arguments, str)
                        else json.dumps(arguments, ensure_ascii=False),
                    },
                }
            )
        self.calls += len(out)
        return out, ""


def _without_partial(text: str, marker: str) -> str:
    """`text` without a trailing proper prefix of `marker` (a closing tag cut short)."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:k]):
            return text[:-k]
    return text
