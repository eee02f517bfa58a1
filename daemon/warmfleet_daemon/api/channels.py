"""Models that write channels (gpt-oss's harmony format): a response is a run of
messages, each a header and a body,

    <|channel|>analysis<|message|>thinking...<|end|>
    <|start|>assistant<|channel|>final<|message|>the answer<|return|>
    <|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>{...}<|call|>

(the prompt ends in `<|start|>assistant`, so the first header starts at once; the
recipient `to=...` may also follow the channel). The `analysis` channel is thinking,
`final` and `commentary` without a recipient are the answer, a message to
`functions.NAME` is a tool call whose body is its JSON arguments.

Parsed here by its markers, not with openai-harmony: its parser loads the o200k
vocabulary by downloading it at run time (openai/harmony#46), and a daemon never
downloads."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from mlx_lm.generate import TextStateMachine

from warmfleet_daemon.api.output import Piece
from warmfleet_daemon.api.tool_calls import new_call_id

CHANNEL, MESSAGE = "<|channel|>", "<|message|>"
# Body ends: <|return|> and <|call|> are also the model's EOS (then the engine ends it).
_ENDS = ("<|end|>", "<|return|>", "<|call|>")
_CHANNEL_NAME = re.compile(r"<\|channel\|>\s*([A-Za-z_]+)")
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")
_FUNCTIONS = "functions."


def writes_channels(tokenizer: Any) -> bool:
    """Whether the model's template speaks harmony (what gpt-oss's template renders)."""
    template = str(getattr(tokenizer, "chat_template", None) or "")
    return CHANNEL in template and MESSAGE in template


@dataclass(frozen=True)
class Header:
    channel: str | None
    recipient: str | None  # e.g. functions.get_weather

    @classmethod
    def parse(cls, text: str) -> Header:
        channel = _CHANNEL_NAME.search(text)
        recipient = _RECIPIENT.search(text)
        return cls(channel.group(1) if channel else None, recipient.group(1) if recipient else None)


@dataclass
class ChannelSplitter:
    """Splits a harmony response as it streams into thinking, answer text and tool calls
    (the pieces `OutputSplitter` gives for marker-based models). With `parse_calls`
    false (tool_choice none), a call's body is given back as text."""

    parse_calls: bool = True
    calls: int = 0  # calls given so far
    _state: Any = field(init=False)
    _where: str = field(init=False, default="header")
    _header: str = field(init=False, default="")
    _current: Header | None = field(init=False, default=None)
    _arguments: str = field(init=False, default="")
    _messages: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        machine = TextStateMachine(
            {"header": [(MESSAGE, "body")], "body": [(end, "header") for end in _ENDS]}
        )
        self._state = machine.make_state("header")

    def feed(self, text: str) -> list[Piece]:
        self._state, segments = TextStateMachine.split(self._state, text)
        return list(self._pieces(segments))

    def finish(self) -> list[Piece]:
        self._state, rest, current = TextStateMachine.flush(self._state)
        out = list(self._pieces([(current, rest)]))
        if self._where == "body":
            out.extend(self._close())
        elif self._header.strip() and not self._messages and CHANNEL not in self._header:
            out.append(Piece("text", self._header))  # no harmony at all: plain text
        return out

    def _pieces(self, segments: list[tuple[str, str]]) -> Iterator[Piece]:
        for state, text in segments:
            if state != self._where:
                if state == "body":
                    self._current, self._header = Header.parse(self._header), ""
                    self._messages += 1
                else:
                    yield from self._close()
                self._where = state
            if state == "header":
                self._header += text
            elif text:
                yield from self._body(text)

    def _body(self, text: str) -> Iterator[Piece]:
        header = self._current or Header(None, None)
        if header.recipient is not None and self.parse_calls:
            self._arguments += text
        elif header.channel == "analysis":
            yield Piece("thinking", text)
        else:  # final, commentary to the user (a preamble), or a call not to be parsed
            yield Piece("text", text)

    def _close(self) -> Iterator[Piece]:
        """The end of a message body: a tool call's is the call."""
        header, self._current = self._current, None
        arguments, self._arguments = self._arguments.strip(), ""
        if header is None or header.recipient is None or not self.parse_calls:
            return
        name = header.recipient.removeprefix(_FUNCTIONS)
        self.calls += 1
        call = {"name": name, "arguments": arguments or "{}"}
        yield Piece("tool_call", call={"id": new_call_id(), "type": "function", "function": call})
