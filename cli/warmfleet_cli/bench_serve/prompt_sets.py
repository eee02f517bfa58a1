"""Prompt sets for `bench-serve`: the built-in ones and the user's own files.

Built-in sets (`short`, `medium`, `long`) are agent-style user messages written for
this project; each is sent after the built-in agent system prompt (`data/
system_prompt.md`, about 860 tokens) unless `--system-prompt-file` gives another.
A FILE is JSON or JSONL: message lists, single messages (each its own prompt) or
objects with `messages` and optional `tools`; its prompts are sent as they are, with
`--system-prompt-file` replacing (or adding) their system message.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

BUILTIN_SETS = ("short", "medium", "long")


class PromptSetError(ValueError):
    """A prompt set that cannot be used; the message names the file and the place."""


@dataclass(frozen=True)
class BenchPrompt:
    messages: tuple[dict[str, Any], ...]
    tools: tuple[dict[str, Any], ...] | None = None

    def body(self) -> dict[str, Any]:
        out: dict[str, Any] = {"messages": list(self.messages)}
        if self.tools:
            out["tools"] = list(self.tools)
        return out


@dataclass(frozen=True)
class PromptSet:
    name: str  # the built-in name or the file's stem
    prompts: tuple[BenchPrompt, ...]


def builtin_system_prompt() -> str:
    return _data("system_prompt.md").strip()


def load_prompt_sets(spec: str, system_prompt: str | None = None) -> list[PromptSet]:
    """`short,long,my.jsonl` -> the sets, with `system_prompt` (if any) as every
    prompt's system message."""
    names = [s.strip() for s in spec.split(",") if s.strip()]
    if not names:
        raise PromptSetError("--prompts is empty: give short, medium, long or a FILE")
    sets = []
    for name in names:
        loaded = load_prompt_set(name)
        system = system_prompt
        if system is None and name in BUILTIN_SETS:
            system = builtin_system_prompt()
        if system is not None:
            loaded = PromptSet(
                loaded.name, tuple(with_system_prompt(p, system) for p in loaded.prompts)
            )
        sets.append(loaded)
    seen = [s.name for s in sets]
    if len(set(seen)) != len(seen):
        raise PromptSetError(f"prompt set names must differ: {', '.join(seen)}")
    return sets


def load_prompt_set(name_or_path: str) -> PromptSet:
    if name_or_path in BUILTIN_SETS:
        return PromptSet(name_or_path, _parse(_data(f"{name_or_path}.json"), name_or_path))
    path = Path(name_or_path).expanduser()
    if not path.is_file():
        raise PromptSetError(
            f"{name_or_path!r} is neither a built-in prompt set ({', '.join(BUILTIN_SETS)}) "
            "nor a file"
        )
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PromptSetError(f"cannot read {path}: {exc}") from exc
    return PromptSet(path.stem, _parse(text, str(path)))


def with_system_prompt(prompt: BenchPrompt, system: str) -> BenchPrompt:
    rest = [m for m in prompt.messages if m.get("role") != "system"]
    return BenchPrompt(({"role": "system", "content": system}, *rest), prompt.tools)


def warm_prompts(sets: list[PromptSet]) -> list[dict[str, Any]]:
    """The `--warm-prompts` entries ({name, messages, tools}) for the static part the
    prompts share: every message before the last, once per distinct value."""
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for prompt_set in sets:
        for prompt in prompt_set.prompts:
            head = list(prompt.messages[:-1])
            if not head:
                continue
            key = json.dumps([head, prompt.tools], sort_keys=True)
            if key in seen:
                continue
            seen.add(key)
            entry: dict[str, Any] = {"name": f"bench-{len(out) + 1}", "messages": head}
            if prompt.tools:
                entry["tools"] = list(prompt.tools)
            out.append(entry)
    return out


def _data(name: str) -> str:
    return resources.files("warmfleet_cli.bench_serve").joinpath("data", name).read_text("utf-8")


def _parse(text: str, source: str) -> tuple[BenchPrompt, ...]:
    """JSON (a list) or JSONL (one prompt per line)."""
    stripped = text.strip()
    if not stripped:
        raise PromptSetError(f"{source} is empty")
    items: list[tuple[str, Any]]
    try:
        whole = json.loads(stripped)
    except json.JSONDecodeError:
        whole = None
    if isinstance(whole, dict) and isinstance(whole.get("prompts"), list):
        whole = whole["prompts"]
    if isinstance(whole, list):
        items = [(f"{source} item {n}", item) for n, item in enumerate(whole, 1)]
    else:
        items = []
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                items.append((f"{source}:{n}", json.loads(line)))
            except json.JSONDecodeError as exc:
                raise PromptSetError(f"{source}:{n}: not valid JSON: {exc.msg}") from exc
    prompts = tuple(_prompt(where, item) for where, item in items)
    if not prompts:
        raise PromptSetError(f"{source} has no prompts")
    return prompts


def _prompt(where: str, item: Any) -> BenchPrompt:
    tools = None
    if isinstance(item, dict) and "messages" in item:
        tools = item.get("tools")
        item = item["messages"]
    if isinstance(item, dict):  # one message: a prompt of its own
        item = [item]
    if not isinstance(item, list) or not item:
        raise PromptSetError(f"{where}: expected a message, a message list or {{messages}}")
    for k, message in enumerate(item):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise PromptSetError(f"{where}: message {k} needs a string `role`")
        if "content" not in message:
            raise PromptSetError(f"{where}: message {k} has no `content`")
    if tools is not None and (
        not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools)
    ):
        raise PromptSetError(f"{where}: `tools` must be a list of objects")
    return BenchPrompt(tuple(item), tuple(tools) if tools else None)
