"""A response's text split as it streams into thinking, answer text and tool calls:
what the agent APIs (Anthropic `thinking`/`text`/`tool_use` blocks, Responses
`reasoning`/`message`/`function_call` items) and chat completions' `reasoning_content`
are made of.

Thinking is what the model writes between its family's thinking markers (mlx-lm's
`think_start`/`think_end`, e.g. `<think>...</think>` for Qwen3 and the DeepSeek-R1
distills; `<think>` tags a template writes but the vocabulary lacks are found as text
too); a response starts inside it when the prompt ends in an open marker (templates
that open the thinking themselves). Tool calls are parsed from the answer text only,
by the model family's format (`ToolCallParser`)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from mlx_lm.generate import TextStateMachine

from warmfleet_daemon.api.tool_calls import ToolCallParser

Kind = Literal["thinking", "text", "tool_call"]


@dataclass(frozen=True)
class Piece:
    kind: Kind
    text: str = ""
    call: dict[str, Any] | None = None  # OpenAI's shape: {id, type, function: {name, arguments}}


@dataclass(frozen=True)
class ThinkingMarkers:
    start: str
    end: str


def thinking_markers(tokenizer: Any) -> ThinkingMarkers | None:
    """The model's thinking markers, if it has any."""
    if getattr(tokenizer, "has_thinking", False) and tokenizer.think_end:
        return ThinkingMarkers(str(tokenizer.think_start), str(tokenizer.think_end))
    template = str(getattr(tokenizer, "chat_template", None) or "")
    if "<think>" in template and "</think>" in template:
        return ThinkingMarkers("<think>", "</think>")
    return None


def starts_thinking(markers: ThinkingMarkers | None, prompt_text: str | None) -> bool:
    """Whether a response to this prompt starts inside a thinking section."""
    if markers is None or not prompt_text:
        return False
    return prompt_text.rfind(markers.start) > prompt_text.rfind(markers.end)


class Splitter(Protocol):
    """Reads a response's text as it comes into pieces: `OutputSplitter` (thinking
    markers, the family's tool-call format) or `channels.ChannelSplitter` (harmony)."""

    @property
    def calls(self) -> int:
        """Tool calls given so far."""
        ...

    def feed(self, text: str) -> list[Piece]: ...

    def finish(self) -> list[Piece]: ...


@dataclass
class OutputSplitter:
    """Feed it the response's text as it comes; it gives back pieces that are safe to
    send (a marker cut in two is held back until it is decided)."""

    markers: ThinkingMarkers | None
    tools: ToolCallParser | None
    thinking_first: bool = False
    _state: Any = field(init=False)

    def __post_init__(self) -> None:
        transitions: dict[str, list[tuple[str, str]]] = {"normal": [], "thinking": []}
        if self.markers is not None:
            transitions["normal"].append((self.markers.start, "thinking"))
            transitions["thinking"].append((self.markers.end, "normal"))
        machine = TextStateMachine(transitions)
        self._state = machine.make_state("thinking" if self.thinking_first else "normal")

    @property
    def calls(self) -> int:
        return self.tools.calls if self.tools is not None else 0

    def feed(self, text: str) -> list[Piece]:
        self._state, segments = TextStateMachine.split(self._state, text)
        return list(self._pieces(segments, final=False))

    def finish(self) -> list[Piece]:
        self._state, rest, current = TextStateMachine.flush(self._state)
        return list(self._pieces([(current, rest)], final=True))

    def _pieces(self, segments: list[tuple[str, str]], *, final: bool) -> Iterator[Piece]:
        for state, text in segments:
            if state == "thinking":
                if text:
                    yield Piece("thinking", text)
            else:
                yield from self._answer(text)
        if final and self.tools is not None:
            content, calls = self.tools.finish()
            yield from _answer_pieces(content, calls)

    def _answer(self, text: str) -> Iterator[Piece]:
        if self.tools is None:
            if text:
                yield Piece("text", text)
            return
        content, calls = self.tools.feed(text)
        yield from _answer_pieces(content, calls)


def _answer_pieces(content: str, calls: list[dict[str, Any]]) -> Iterator[Piece]:
    if content:
        yield Piece("text", content)
    for call in calls:
        yield Piece("tool_call", call=call)


def merge(pieces: list[Piece]) -> list[Piece]:
    """Adjacent pieces of the same kind as one (tool calls stay apart)."""
    out: list[Piece] = []
    for piece in pieces:
        if out and piece.kind != "tool_call" and out[-1].kind == piece.kind:
            out[-1] = Piece(piece.kind, out[-1].text + piece.text)
        else:
            out.append(piece)
    return out
