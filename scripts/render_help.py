"""The command-line reference, rendered from the command line itself: every `warmfleet`
command and subcommand with its `--help` as `warmfleet ... --help` prints it.

As an MkDocs hook (`hooks:` in mkdocs.yml) it replaces the marker in docs/reference.md
with that at every build, so the reference cannot drift from the commands; run as a
script, it prints the same Markdown. tests/docs/ use `commands()` and `help_text()` to
check every `--flag` the README and the docs show."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import os
import sys
from collections.abc import Iterator
from functools import cache
from typing import Any

MARKER = "<!-- warmfleet --help -->"
COLUMNS = "100"  # as tests/cli/help/ records them


def commands() -> list[tuple[str, ...]]:
    """Every command path, `()` for `warmfleet` itself, in the order `warmfleet --help`
    lists them, each followed by its own subcommands (`service install`, `sim trace`...):
    read from the dispatcher's table and the parsers its modules build."""
    from warmfleet_cli.main import COMMANDS

    found: list[tuple[str, ...]] = [()]
    for name, command in COMMANDS.items():
        parser = argparse.ArgumentParser(prog=f"warmfleet {name}")
        getattr(importlib.import_module(command.module), command.add_arguments)(parser)
        found.extend(_walk(parser, (name,)))
    return found


def _walk(parser: argparse.ArgumentParser, path: tuple[str, ...]) -> Iterator[tuple[str, ...]]:
    yield path
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            seen: set[int] = set()
            for name, sub in action.choices.items():
                if id(sub) not in seen:  # an alias names the same parser
                    seen.add(id(sub))
                    yield from _walk(sub, (*path, name))


@cache
def help_text(path: tuple[str, ...]) -> str:
    """What `warmfleet PATH... --help` prints, at 100 columns."""
    from warmfleet_cli.main import main

    out = io.StringIO()
    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = COLUMNS
    try:
        with contextlib.redirect_stdout(out):
            try:
                main([*path, "--help"])
            except SystemExit as done:
                if done.code not in (0, None):
                    raise RuntimeError(f"warmfleet {' '.join(path)} --help: {done.code}") from None
    finally:
        if before is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = before
    return out.getvalue()


def render() -> str:
    """The reference: a section per command, its `--help` verbatim."""
    sections = []
    for path in commands():
        name = " ".join(("warmfleet", *path))
        sections.append(f"## `{name}`\n\n```text\n{help_text(path).rstrip()}\n```\n")
    return "\n".join(sections)


def on_page_markdown(markdown: str, **_: Any) -> str:
    """MkDocs hook: the reference in place of its marker (other pages as they are)."""
    return markdown.replace(MARKER, render()) if MARKER in markdown else markdown


if __name__ == "__main__":
    sys.stdout.write(render())
