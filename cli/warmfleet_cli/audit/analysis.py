"""What `warmfleet audit LOG` computes: why a prefix cache misses, from a log of requests.

LOG is JSONL (or one JSON list): chat requests (`{"messages": [...], "tools": [...]}`,
other OpenAI fields ignored, also nested under `request` or `body`) or rendered
prompts (`{"prompt": "..."}` or token ids, or a bare JSON string). Chat requests are
rendered and tokenized by `PromptBuilder` with the model's own template and tokenizer,
exactly as the daemon does; `divergence.analyze` does the rest.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from warmfleet_common.contract import ChatMessage, ToolDefinition
from warmfleet_common.prompts import PromptBuilder, PromptError
from warmfleet_daemon.divergence import DivergenceReport, PromptTokens, analyze

_MESSAGES = TypeAdapter(list[ChatMessage])
_TOOLS = TypeAdapter(list[ToolDefinition] | None)


class AuditError(Exception):
    """The audit cannot run (no tokenizer, unreadable or empty log)."""


@dataclass(frozen=True)
class ChatEntry:
    line: int
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None


@dataclass(frozen=True)
class TextEntry:
    line: int
    prompt: str | list[int]


@dataclass
class LoadedLog:
    entries: list[ChatEntry | TextEntry] = field(default_factory=list)
    errors: list[tuple[int, str]] = field(default_factory=list)  # (line, what is wrong)


def load_tokenizer(model: str | None, tokenizer_path: str | None) -> tuple[Any, str]:
    """(an mlx-lm TokenizerWrapper, a name for it) without loading any weights."""
    try:
        if tokenizer_path:
            from mlx_lm.tokenizer_utils import TokenizerWrapper
            from transformers import AutoTokenizer

            return TokenizerWrapper(AutoTokenizer.from_pretrained(tokenizer_path)), tokenizer_path
        spec = model or "default"
        if spec == "default" or spec.startswith("tiny-random"):  # tiny models use it too
            from warmfleet_daemon.models.loader import EMBEDDED_NAME, load_gguf_tokenizer_only

            return load_gguf_tokenizer_only(), f"{EMBEDDED_NAME} (embedded)"
        if spec.endswith(".gguf"):
            from warmfleet_daemon.models.gguf import load_gguf_tokenizer

            return load_gguf_tokenizer(Path(spec).expanduser()), spec
        # An mlx-lm directory or a Hugging Face id: the tokenizer mlx-lm's load() gives,
        # without the weights.
        from mlx_lm.utils import load_tokenizer as load_mlx_lm_tokenizer

        return load_mlx_lm_tokenizer(Path(spec).expanduser() if Path(spec).exists() else spec), spec
    except Exception as exc:  # many libraries, many exception types: all mean "cannot"
        raise AuditError(f"cannot load the tokenizer: {type(exc).__name__}: {exc}") from exc


def read_log(path: str | Path) -> LoadedLog:
    """Parse LOG; bad lines are collected with their line numbers, not fatal."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise AuditError(f"cannot read {path}: {exc}") from exc
    out = LoadedLog()
    for line, item, error in _records(text):
        if error is not None:
            out.errors.append((line, error))
            continue
        try:
            out.entries.append(_entry(line, item))
        except ValueError as exc:
            out.errors.append((line, str(exc)))
    return out


def render(builder: PromptBuilder, log: LoadedLog) -> list[PromptTokens]:
    """Tokenize every entry as the daemon would; rendering errors join `log.errors`."""
    prompts = []
    for entry in log.entries:
        try:
            if isinstance(entry, ChatEntry):
                rendered = builder.chat(entry.messages, entry.tools)
                static = rendered.content_start or None
                prompts.append(PromptTokens(rendered.tokens, static))
            else:
                prompts.append(PromptTokens(builder.completion(entry.prompt).tokens))
        except PromptError as exc:
            log.errors.append((entry.line, str(exc)))
    log.errors.sort()
    return prompts


def audit(
    log_path: str | Path,
    *,
    model: str | None = None,
    tokenizer_path: str | None = None,
    prefix_tokens: int = 512,
    block_size: int = 16,
) -> tuple[DivergenceReport, dict[str, Any]]:
    """Run the audit; returns the report and what it was run on (for the output)."""
    log = read_log(log_path)
    if not log.entries:
        raise AuditError(_no_entries(log_path, log))
    tokenizer, name = load_tokenizer(model, tokenizer_path)
    builder = PromptBuilder(tokenizer)
    prompts = render(builder, log)
    if not prompts:
        raise AuditError(_no_entries(log_path, log))
    report = analyze(prompts, builder.decode, prefix_tokens=prefix_tokens, block_size=block_size)
    chat = sum(isinstance(e, ChatEntry) for e in log.entries)
    meta = {
        "log": str(log_path),
        "tokenizer": name,
        "chat_requests": chat,
        "rendered_prompts": len(log.entries) - chat,
        "skipped_lines": [{"line": n, "error": e} for n, e in log.errors],
    }
    return report, meta


def _records(text: str) -> Iterator[tuple[int, Any, str | None]]:
    """(line number, parsed JSON, error) for each record; a file that is one JSON list
    gives its items (numbered from 1)."""
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            items = json.loads(text)
        except json.JSONDecodeError:
            items = None  # JSONL whose first record is a list: read it line by line
        if isinstance(items, list):
            for n, item in enumerate(items, 1):
                yield n, item, None
            return
    for n, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        try:
            yield n, json.loads(raw), None
        except json.JSONDecodeError as exc:
            yield n, None, f"not valid JSON: {exc.msg} (column {exc.colno})"


def _entry(line: int, item: Any) -> ChatEntry | TextEntry:
    if isinstance(item, str):
        if not item:
            raise ValueError("empty prompt")
        return TextEntry(line, item)
    if isinstance(item, list):  # a bare message list (vllm-mlx's warm-prompts shape)
        item = {"messages": item}
    if not isinstance(item, dict):
        raise ValueError(f"expected a JSON object, got {type(item).__name__}")
    for key in ("request", "body"):
        if "messages" not in item and "prompt" not in item and isinstance(item.get(key), dict):
            item = item[key]
    if "messages" in item:
        messages = _validated(_MESSAGES, item["messages"], "messages")
        tools = _validated(_TOOLS, item.get("tools"), "tools")
        if not messages:
            raise ValueError("messages must not be empty")
        return ChatEntry(
            line,
            [m.as_template_message() for m in messages],
            [t.model_dump(exclude_none=True) for t in tools] if tools else None,
        )
    prompt = item.get("prompt", item.get("text"))
    if isinstance(prompt, str) and prompt:
        return TextEntry(line, prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return TextEntry(line, [int(t) for t in prompt])
    raise ValueError('expected "messages" (a chat request) or "prompt" (a rendered prompt)')


def _validated(adapter: TypeAdapter[Any], value: Any, name: str) -> Any:
    try:
        return adapter.validate_python(value)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in (name, *first["loc"]))
        raise ValueError(f"bad chat request: {where}: {first['msg']}") from exc


def _no_entries(path: str | Path, log: LoadedLog) -> str:
    if not log.errors:
        return f"{path} has no requests"
    shown = "; ".join(f"line {n}: {e}" for n, e in log.errors[:3])
    return f"{path} has no usable requests ({len(log.errors)} bad): {shown}"
