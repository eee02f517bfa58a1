"""What a chat template refuses (or drops) of the coding agents' layouts, and what it gets
instead.

Agents send layouts that some templates refuse with a template error: Claude Code a
`system` message after the user's words (its environment, later its reminders), Codex
`developer` messages mid-conversation (the Responses translation makes them `system`),
Codex and opencode two user messages in a row, and tool results that become user
messages (templates without a tool role) next to the user's words. Gemma's and Mistral
Small's templates insist that user and assistant alternate, Devstral's refuses a system
message after an assistant's, Mistral Small's wants tool call ids of 9 letters and digits,
and gpt-oss's renders no system message but the first: it drops the others silently.

What a template takes is probed once, on sample conversations, when its PromptBuilder is
made, so a conversation renders the same way on every turn: the choice never depends on
the request (else an earlier turn's rendering would change once a later turn adds a
message the template refuses, and the prefix cache would miss). What it refuses becomes:
- a `system` message after the first message: folded in place into the user message it
  follows (after a blank line), or else into the next user message (before its text),
  or else a user message of its own; never hoisted to the top, which would change the
  prompt's start whenever a new one arrives; leading system messages are joined;
- consecutive user messages: one user message, joined by a blank line;
- tool call ids: 9 letters and digits derived from the id (the same on every turn).
Every change appends to or keeps what earlier turns rendered, so a turn's prompt stays a
prefix of the next one's.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Message = Mapping[str, Any]
Render = Callable[[Sequence[Message], Sequence[Mapping[str, Any]] | None], object]

SEPARATOR = "\n\n"
_ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
_TOOL = {
    "type": "function",
    "function": {"name": "run", "parameters": {"type": "object", "properties": {}}},
}


def _call(call_id: str) -> list[dict[str, Any]]:
    function = {"name": "run", "arguments": {}}
    return [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": call_id, "type": "function", "function": function}],
        },
        {"role": "tool", "tool_call_id": call_id, "content": "ok"},
        {"role": "assistant", "content": "done"},
    ]


_S, _U, _A = ({"role": r, "content": r[0]} for r in ("system", "user", "assistant"))
_LATER = {"role": "system", "content": "zq7"}  # a later system message, seen or not
_SYSTEM_PROBES = (
    [_S, _U, _LATER, _A, _U],  # after the user's words (Claude Code)
    [_S, _U, _A, _LATER, _U],  # before them (Codex's developer messages)
    [_S, _LATER, _U],  # two leading ones
)


@dataclass(frozen=True)
class RoleRules:
    system_anywhere: bool = True
    consecutive_users: bool = True
    short_call_ids: bool = False

    @classmethod
    def probe(cls, render: Render) -> RoleRules:
        """The rules of the template `render` renders with (it raises on a refusal)."""

        def renders(messages: Sequence[Message], tools: Any = None) -> bool:
            try:
                text = render(messages, tools)
            except Exception:  # any refusal: the template's own or a render error
                return False
            # Rendered, but a later system message left out (gpt-oss's drops them)?
            return _LATER not in messages or _LATER["content"] in str(text)

        if not renders([_S, _U, _A, _U]):
            return cls()  # a template that wants something else: nothing to learn here
        long_ids = renders([_S, _U, *_call("call_0123456789abcdef"), _U], [_TOOL])
        return cls(
            system_anywhere=all(renders(p) for p in _SYSTEM_PROBES),
            consecutive_users=renders([_S, _U, _U]),
            short_call_ids=not long_ids and renders([_S, _U, *_call("a1B2c3D4e"), _U], [_TOOL]),
        )

    @property
    def strict(self) -> bool:
        return not self.system_anywhere or not self.consecutive_users or self.short_call_ids

    def apply(self, messages: Sequence[Message]) -> list[Message]:
        out = list(messages)
        if self.short_call_ids:
            out = [_short_ids(m) for m in out]
        if not self.system_anywhere:
            out = _fold_system(out)
        if not self.consecutive_users:
            out = _join_users(out)
        return out


def short_call_id(call_id: str) -> str:
    """9 letters and digits for a tool call id, the same for the same id."""
    number = int.from_bytes(hashlib.blake2b(call_id.encode(), digest_size=8).digest(), "big")
    chars = []
    for _ in range(9):
        number, digit = divmod(number, len(_ALPHABET))
        chars.append(_ALPHABET[digit])
    return "".join(chars)


def _short_ids(message: Message) -> Message:
    if message.get("role") == "tool" and isinstance(message.get("tool_call_id"), str):
        return {**message, "tool_call_id": short_call_id(message["tool_call_id"])}
    calls = message.get("tool_calls")
    if not calls:
        return message
    return {
        **message,
        "tool_calls": [
            {**c, "id": short_call_id(c["id"])} if isinstance(c.get("id"), str) else c
            for c in calls
        ],
    }


def _joined(*texts: Any) -> str:
    return SEPARATOR.join(str(t) for t in texts if t)


def _text(message: Message) -> bool:
    return isinstance(message.get("content") or "", str)


def _fold_system(messages: Sequence[Message]) -> list[Message]:
    out: list[Message] = []
    pending: list[Any] = []  # system texts for the next user message
    for index, message in enumerate(messages):
        role = message.get("role")
        if role == "system" and index > 0 and _text(message):
            text = message.get("content") or ""
            previous = out[-1] if out else None
            leading = all(m.get("role") == "system" for m in out)
            into_previous = leading or (previous or {}).get("role") == "user"
            if previous is not None and not pending and _text(previous) and into_previous:
                out[-1] = {**previous, "content": _joined(previous.get("content"), text)}
                continue
            pending.append(text)
            continue
        if pending:
            if role == "user" and _text(message):
                message = {**message, "content": _joined(*pending, message.get("content"))}
            else:
                out.append({"role": "user", "content": _joined(*pending)})
            pending = []
        out.append(message)
    if pending:
        out.append({"role": "user", "content": _joined(*pending)})
    return out


def _join_users(messages: Sequence[Message]) -> list[Message]:
    out: list[Message] = []
    for message in messages:
        previous = out[-1] if out else None
        if (
            previous is not None
            and message.get("role") == "user" == previous.get("role")
            and _text(message)
            and _text(previous)
        ):
            out[-1] = {
                **previous,
                "content": _joined(previous.get("content"), message.get("content")),
            }
            continue
        out.append(message)
    return out
