"""A trace's request records as the HTTP requests the real CLIs send.

Claude Code: `POST /v1/messages?beta=true` with its headers (`X-Claude-Code-Session-Id`),
`system` blocks (the billing header first, with the session's fingerprint), `tools`,
`messages` (the first user message: a system-reminder and the words; then the
environment as a `system` message; then each turn: the assistant's text and `tool_use`
blocks, the `tool_result` blocks or the next words), `metadata.user_id` (a JSON string
holding the session id), `max_tokens`, `stream: true`. Codex: `POST /v1/responses` with
its headers (`session-id`), `input` (two `developer` messages, the
`<environment_context>` user message, the words; then `message`, `function_call` and
`function_call_output` items), `tools`, `prompt_cache_key` (the session id),
`max_output_tokens`, `stream: true`.

Each step's body extends the previous step's as the real CLIs do: its `messages` /
`input` start with the previous step's, then its response, then what the step adds, so
a prefix cache holding the previous request (and its response) serves all of it. Where
this differs from the real CLIs: the assistant's words are the trace's pseudo-text
unless the replay passes the response it got (`reply`); Claude Code's moving
`cache_control` breakpoint, its mid-conversation reminders and thinking blocks, and
Codex's reasoning items are left out; Codex sends no `max_output_tokens` (the trace's
`out` needs one).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from warmfleet_cli.sim.layouts import Layout, claude_code_headers, codex_headers, layout
from warmfleet_cli.sim.population import COMPACTION
from warmfleet_cli.sim.text import chars, key_int, stable_uuid, text, words
from warmfleet_cli.sim.trace import Record

CALL_INPUT_TOKENS = 24  # a tool call's arguments, counted in the step's output
EPHEMERAL: dict[str, str] = {"type": "ephemeral"}


@dataclass(frozen=True)
class BodyOptions:
    model: str = "default"
    memory: bool = False  # Claude Code names each developer's memory directory
    date: str = "2026-12-07"

    @classmethod
    def of(cls, header: Mapping[str, Any], model: str = "default") -> BodyOptions:
        """The options a trace was generated with (its header's params)."""
        params = header.get("params", {})
        return cls(model, bool(params.get("claude_memory")), str(params.get("date", cls.date)))


@dataclass(frozen=True)
class Request:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


def _id(prefix: str, *parts: object) -> str:
    digest = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=12)
    return prefix + digest.hexdigest()


class SessionBodies:
    """One session's requests, built step after step (feed every step, in turn order)."""

    def __init__(self, options: BodyOptions = BodyOptions()) -> None:
        self.options = options
        self.items: list[dict[str, Any]] = []  # messages / input items after the head
        self.previous: Record | None = None
        self.first_words = ""
        self.turn_id = ""

    def request(self, record: Record, reply: str | None = None) -> Request:
        """`record`'s request. `reply`: the text the previous step's response really
        had, used instead of the trace's pseudo-text in this and later requests."""
        previous, kind = self.previous, record["kind"]
        if previous is not None and previous["turn"] != record["turn"] - 1:
            raise ValueError(
                f"session {record['session']}: turn {record['turn']} after {previous['turn']}"
            )
        if previous is None and record["turn"] != 0:
            raise ValueError(f"session {record['session']}: starts at turn {record['turn']}")
        lay = layout(
            record["agent"],
            record["version"],
            record["dev"],
            self.options.memory,
            self.options.date,
        )
        claude = record["agent"] == "claude-code"
        if previous is not None and previous["kind"] != "compact":
            self.items.extend(self._response(previous, lay, reply))
        session, turn = record["session"], record["turn"]
        if kind in ("user", "resume"):
            self.turn_id = stable_uuid(session, turn, "turn")
            said = words(f"{session}/{turn}/words", record["user"]) if record["user"] else ""
            if turn == 0:
                self.first_words = said
        items = self.items
        if (kind == "user" and turn == 0) or kind == "resume":
            summary = ""
            if kind == "resume":
                assert previous is not None
                key = f"{session}/{previous['turn']}/summary"
                summary = reply if reply is not None else text(key, chars(previous["out"]))
            items = self.items = self._opening(record, lay, summary, said)
        elif kind == "user":
            items.append(self._user([said], claude))
        elif kind == "tool":
            assert previous is not None
            items.extend(self._results(record, previous, claude))
        elif kind == "compact":
            key = f"{record['agent']}/{record['version']}/compact"
            instruction = text(key, chars(int(COMPACTION["instruction_tokens"][0])))
            items = [*items, self._user([instruction], claude)]
        else:
            raise ValueError(f"unknown kind {kind!r} in {record}")
        self.previous = record
        if claude:
            return self._claude(record, lay, items)
        return self._codex(record, lay, items)

    # -- the parts ------------------------------------------------------------------------

    def _opening(self, record: Record, lay: Layout, summary: str, said: str) -> list[Any]:
        """The first request's messages after the static head (or after a compaction:
        the summary before the words)."""
        parts = [p for p in (summary, said) if p]
        if record["agent"] == "claude-code":
            first = self._user([lay.reminder, *parts], True)
            environment = {
                "role": "system",
                "content": [{"type": "text", "text": lay.environment, "cache_control": EPHEMERAL}],
                "output_config": {"effort": "medium"},
            }
            return [first, environment]
        session = record["session"]
        items = [self._codex_user(lay.environment, _id("msg_", session, record["turn"], "env"))]
        for i, part in enumerate(parts):
            items.append(self._codex_user(part, _id("msg_", session, record["turn"], i)))
        return items

    @staticmethod
    def _user(texts: Iterable[str], claude: bool) -> dict[str, Any]:
        if claude:
            return {"role": "user", "content": [{"type": "text", "text": t} for t in texts]}
        content = [{"type": "input_text", "text": t} for t in texts]
        return {"type": "message", "role": "user", "content": content}

    @staticmethod
    def _codex_user(said: str, item_id: str) -> dict[str, Any]:
        content = [{"type": "input_text", "text": said}]
        return {"type": "message", "id": item_id, "role": "user", "content": content}

    def _calls(self, record: Record, lay: Layout) -> list[tuple[str, str, str, dict[str, str]]]:
        """(call id, tool name, its first parameter, its input) of each call `record`'s
        response makes."""
        usable = [
            t for t in lay.tools if t.get("type") in (None, "function") and "defer_loading" not in t
        ]
        out = []
        for i in range(record["calls"]):
            tool = usable[key_int(record["session"], record["turn"], i) % len(usable)]
            schema = tool.get("input_schema") or tool.get("parameters") or {}
            param = next(iter(schema.get("properties", {"input": None})))
            value = text(f"{record['session']}/{record['turn']}/call/{i}", chars(CALL_INPUT_TOKENS))
            prefix = "toolu_" if record["agent"] == "claude-code" else "call_"
            call_id = _id(prefix, record["session"], record["turn"], i)
            out.append((call_id, tool["name"], param, {param: value}))
        return out

    def _response(self, record: Record, lay: Layout, reply: str | None) -> list[dict[str, Any]]:
        """`record`'s response as the next request carries it."""
        session, turn = record["session"], record["turn"]
        size = max(8, record["out"] - CALL_INPUT_TOKENS * record["calls"])
        said = reply if reply is not None else text(f"{session}/{turn}/reply", chars(size))
        calls = self._calls(record, lay)
        if record["agent"] == "claude-code":
            content: list[dict[str, Any]] = [{"type": "text", "text": said}]
            content += [
                {"type": "tool_use", "id": call_id, "name": name, "input": arguments}
                for call_id, name, _, arguments in calls
            ]
            return [{"role": "assistant", "content": content}]
        items: list[dict[str, Any]] = [
            {
                "type": "message",
                "id": _id("msg_", session, turn, "reply"),
                "role": "assistant",
                "content": [{"type": "output_text", "text": said}],
            }
        ]
        items += [
            {"type": "function_call", "call_id": call_id, "name": name, "arguments": json.dumps(a)}
            for call_id, name, _, a in calls
        ]
        return items

    def _results(self, record: Record, previous: Record, claude: bool) -> list[dict[str, Any]]:
        session, turn = record["session"], record["turn"]
        sizes = record["results"]
        if len(sizes) != previous["calls"]:
            raise ValueError(
                f"session {session} turn {turn}: {len(sizes)} results for {previous['calls']} calls"
            )
        prefix = "toolu_" if claude else "call_"
        ids = [_id(prefix, session, previous["turn"], i) for i in range(len(sizes))]
        outputs = [text(f"{session}/{turn}/result/{i}", chars(n), 0.7) for i, n in enumerate(sizes)]
        if claude:
            blocks = [
                {"type": "tool_result", "tool_use_id": i, "content": o}
                for i, o in zip(ids, outputs)
            ]
            return [{"role": "user", "content": blocks}]
        return [
            {"type": "function_call_output", "call_id": i, "output": o}
            for i, o in zip(ids, outputs)
        ]

    # -- the requests ---------------------------------------------------------------------

    def _claude(self, record: Record, lay: Layout, items: list[Any]) -> Request:
        session = record["session"]
        fingerprint = hashlib.sha256(self.first_words.encode()).hexdigest()[:3]
        billing = (
            f"x-anthropic-billing-header: cc_version={record['version']}.{fingerprint}; "
            "cc_entrypoint=cli;"
        )
        system: list[dict[str, Any]] = [{"type": "text", "text": billing}]
        system += [{"type": "text", "text": t, "cache_control": EPHEMERAL} for t in lay.system]
        user_id = {"device_id": lay.device, "account_uuid": "", "session_id": session}
        body = {
            "model": self.options.model,
            "messages": list(items),  # a copy: the session goes on appending
            "system": system,
            "tools": list(lay.tools),
            "metadata": {"user_id": json.dumps(user_id, separators=(",", ":"))},
            "max_tokens": record["out"],
            "thinking": {"type": "adaptive", "display": "omitted"},
            "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
            "output_config": {"effort": "medium"},
            "stream": True,
        }
        headers = claude_code_headers(record["version"], session)
        return Request("/v1/messages?beta=true", headers, body)

    def _codex(self, record: Record, lay: Layout, items: list[Any]) -> Request:
        session = record["session"]
        developer = [
            {
                "type": "message",
                "id": _id("msg_", session, "developer", i),
                "role": "developer",
                "content": [{"type": "input_text", "text": t} for t in texts],
            }
            for i, texts in enumerate((lay.system[:1], lay.system[1:]))
        ]
        body: dict[str, Any] = {
            "model": self.options.model,
            "stream": True,
            "input": [*developer, *items],  # a copy: the session goes on appending
            "tools": list(lay.tools),
            "tool_choice": "auto",
            "parallel_tool_calls": True,
            "reasoning": {"summary": "auto"},
            "store": False,
            "include": ["reasoning.encrypted_content"],
            "prompt_cache_key": session,
            "max_output_tokens": record["out"],
            "client_metadata": {
                "session_id": session,
                "thread_id": session,
                "turn_id": self.turn_id,
                "x-codex-installation-id": lay.device,
            },
        }
        return Request("/v1/responses", codex_headers(record["version"], session), body)


def materialize(
    record: Record, history: Iterable[Record], options: BodyOptions = BodyOptions()
) -> tuple[str, dict[str, str], dict[str, Any]]:
    """(path, headers, body) of `record`, given every earlier step of its session in
    turn order. A replay that goes step by step keeps a `SessionBodies` per session
    instead (each step then costs what it adds, not the whole history again)."""
    builder = SessionBodies(options)
    for earlier in history:
        builder.request(earlier)
    done = builder.request(record)
    return done.path, done.headers, done.body
