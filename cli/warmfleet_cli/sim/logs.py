"""A request log in the format `warmfleet audit` reads, as a stream of trace records.

The log is JSONL (or one JSON list): chat requests (`{"messages": [...], "tools":
[...]}`, other OpenAI fields kept, also nested under `request` or `body`), bare message
lists, or rendered prompts (`{"prompt": "..."}` or a bare string). Such a log has no
times and no sessions: each line becomes a `logged` record sent `interval` seconds after
the one before (or at the line's own numeric `t`, if it has one), holding its body
inline: `/v1/chat/completions` for chat requests, `/v1/completions` for prompts. Bad
lines are skipped and reported, as the audit does."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from warmfleet_cli.sim.bodies import Request
from warmfleet_cli.sim.trace import Record


@dataclass
class RequestLog:
    records: list[Record] = field(default_factory=list)
    skipped: list[tuple[int, str]] = field(default_factory=list)  # (line, why)


def _items(text: str) -> Iterator[tuple[int, Any, str | None]]:
    if text.lstrip().startswith("["):
        try:
            whole = json.loads(text)
        except json.JSONDecodeError:
            whole = None  # JSONL whose first record is a list
        if isinstance(whole, list):
            yield from ((n, item, None) for n, item in enumerate(whole, 1))
            return
    for n, raw in enumerate(text.splitlines(), 1):
        if raw.strip():
            try:
                yield n, json.loads(raw), None
            except json.JSONDecodeError as exc:
                yield n, None, f"not valid JSON: {exc.msg}"


def _body(item: Any, model: str, max_tokens: int) -> tuple[str, dict[str, Any]]:
    if isinstance(item, str) and item:
        return "/v1/completions", {"model": model, "prompt": item, "max_tokens": max_tokens}
    if isinstance(item, list):
        item = {"messages": item}
    if not isinstance(item, dict):
        raise ValueError(f"expected a JSON object, got {type(item).__name__}")
    for key in ("request", "body"):
        if "messages" not in item and "prompt" not in item and isinstance(item.get(key), dict):
            item = item[key]
    item = {k: v for k, v in item.items() if k != "t"}
    if isinstance(item.get("messages"), list) and item["messages"]:
        return "/v1/chat/completions", {"model": model, "max_tokens": max_tokens, **item}
    prompt = item.get("prompt", item.get("text"))
    if isinstance(prompt, str | list) and prompt:
        body = {k: v for k, v in item.items() if k != "text"}
        return "/v1/completions", {
            "model": model,
            "max_tokens": max_tokens,
            **body,
            "prompt": prompt,
        }
    raise ValueError('expected "messages" (a chat request) or "prompt" (a rendered prompt)')


def read_request_log(
    path: str | Path, *, interval: float = 1.0, model: str = "default", max_tokens: int = 64
) -> RequestLog:
    """Every usable line of the log at `path` as a `logged` record, in time order."""
    out = RequestLog()
    text = Path(path).read_text(encoding="utf-8")
    for index, (line, item, error) in enumerate(_items(text)):
        if error is not None:
            out.skipped.append((line, error))
            continue
        try:
            route, body = _body(item, model, max_tokens)
        except ValueError as exc:
            out.skipped.append((line, str(exc)))
            continue
        own = item.get("t") if isinstance(item, dict) else None
        at = float(own) if isinstance(own, int | float) else index * interval
        out.records.append(
            {"t": round(at, 3), "kind": "logged", "line": line, "path": route, "body": body}
        )
    out.records.sort(key=lambda r: (r["t"], r["line"]))
    return out


def logged_request(record: Record) -> Request:
    """A `logged` record's request, as the log holds it."""
    headers = {"content-type": "application/json"}
    return Request(record["path"], headers, {"stream": True, **record["body"]})
