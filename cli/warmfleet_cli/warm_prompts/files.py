"""The warm-prompts file a capture writes (JSON or YAML, the list of `{name, ...}`
entries `warmfleet serve --warm-prompts` reads), and the WarmPromptSet it prints.

A file that already holds entries keeps them: the captured entry replaces the one of
the same name or is appended, so one file can collect Claude Code's and Codex's."""

from __future__ import annotations

import json
import os
import re
import stat
import tempfile
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import ValidationError

from warmfleet_common.contract import WarmPrompt
from warmfleet_common.crd import API_VERSION

Format = Literal["json", "yaml"]
MAX_FILE_BYTES = 64 << 20  # an existing --out file is read whole: bounded


class OutputError(Exception):
    """The output file cannot be read or written."""


def format_of(path: Path, given: str | None) -> Format:
    if given in ("json", "yaml"):
        return given  # type: ignore[return-value]
    return "yaml" if path.suffix.lower() in (".yaml", ".yml") else "json"


def existing_entries(path: Path) -> list[dict[str, Any]]:
    """The entries already in `path` (none if it does not exist); OutputError if it is
    not a warm-prompts file of warmfleet's format, which a capture must not overwrite."""
    if not path.exists():
        return []
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            raise OutputError(f"{path} is larger than {MAX_FILE_BYTES >> 20} MiB")
        document = yaml.safe_load(path.read_text()) if path.stat().st_size else []
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise OutputError(f"cannot read {path}: {exc}") from exc
    entries = document if isinstance(document, list) else None
    if entries is None or not all(isinstance(e, dict) for e in entries):
        raise OutputError(
            f"{path} exists and is not a list of warm prompts ({{name, ...}} entries); "
            "choose another --out"
        )
    for i, entry in enumerate(entries):
        try:
            WarmPrompt.model_validate(entry)
        except ValidationError as exc:
            raise OutputError(f"{path}: entry {i + 1} is not a warm prompt: {exc}") from exc
    return entries


def merged(entries: list[dict[str, Any]], entry: dict[str, Any]) -> list[dict[str, Any]]:
    """`entries` with `entry` in place of the one of its name, or appended."""
    names = [e.get("name") for e in entries]
    if entry["name"] not in names:
        return [*entries, entry]
    return [entry if n == entry["name"] else e for n, e in zip(names, entries, strict=True)]


def write(path: Path, entries: list[dict[str, Any]], fmt: Format) -> None:
    """Write atomically (a reader never sees half a file)."""
    text = (
        dump_yaml(entries)
        if fmt == "yaml"
        else json.dumps(entries, indent=2, ensure_ascii=False) + "\n"
    )
    directory = path.parent if str(path.parent) else Path(".")
    try:
        fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", dir=directory)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
            # mkstemp makes it 0600: keep the mode of the file it replaces, else 0644.
            os.chmod(temp, stat.S_IMODE(path.stat().st_mode) if path.exists() else 0o644)
            os.replace(temp, path)
        except BaseException:
            os.unlink(temp)
            raise
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {exc}") from exc


def check_writable(path: Path) -> None:
    directory = path.parent if str(path.parent) else Path(".")
    if not directory.is_dir() or not os.access(directory, os.W_OK):
        raise OutputError(f"cannot write {path}: {directory} is not a writable directory")


def warm_prompt_set(entry: dict[str, Any]) -> dict[str, Any]:
    """A WarmPromptSet warming `entry` on every WarmNode."""
    name = re.sub(r"[^a-z0-9-]+", "-", entry["name"].lower()).strip("-")[:63] or "agent"
    return {
        "apiVersion": API_VERSION,
        "kind": "WarmPromptSet",
        "metadata": {"name": name},
        "spec": {"nodeSelector": {}, "prompts": [entry]},
    }


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (system prompts) as literal blocks: readable, and diffable
    when the agent's next version changes a line."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def dump_yaml(document: Any) -> str:
    return str(yaml.dump(document, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=100))
