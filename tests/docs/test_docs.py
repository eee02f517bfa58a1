"""The README and docs/ say what the command line does: every `--flag` shown on a
`warmfleet ...` command line exists in that command's `--help`, every `warmfleet`
command of the getting-started guide parses, and the README keeps to a page or two
with the two commands, `make run`'s ready block as `warmfleet up` prints it and the
fleet picture the docs include. (`make test` builds docs/ with `mkdocs build --strict`:
broken links and anchors, pages outside the nav.)"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import re
import shlex
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
GETTING_STARTED = DOCS / "getting-started.md"
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
SPAN = re.compile(r"`([^`]+)`")
FLAG = re.compile(r"^[\[(]?(--[A-Za-z0-9][\w-]*)")
SEPARATORS = {"&", "&&", "|", "||", ";", ">", ">>", "<", "2>&1"}


@cache
def render_help() -> ModuleType:
    """scripts/render_help.py, the MkDocs hook that renders the command-line reference."""
    spec = importlib.util.spec_from_file_location("render_help", ROOT / "scripts/render_help.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["render_help"] = module
    spec.loader.exec_module(module)
    return module


@cache
def known_commands() -> frozenset[tuple[str, ...]]:
    return frozenset(render_help().commands())


def help_of(path: tuple[str, ...]) -> str:
    text: str = render_help().help_text(path)
    return text


def documents() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


def fenced_lines(text: str) -> Iterator[str]:
    """Each fenced block's logical lines: `\\` continuations joined, and so are the lines
    of a usage synopsis that go on with `[--flag ...]`; shell comments cut off."""
    for block in FENCE.findall(text):
        logical: list[str] = []
        for line in block.splitlines():
            if logical and (logical[-1].endswith("\\") or line.lstrip().startswith("[--")):
                logical[-1] = logical[-1].removesuffix("\\") + " " + line.strip()
            else:
                logical.append(line)
        for line in logical:
            yield re.split(r"(?:^|\s)#", line, maxsplit=1)[0]


def inline_spans(text: str) -> Iterator[str]:
    """The inline code spans outside fenced blocks, their line breaks as spaces."""
    for span in SPAN.findall(FENCE.sub("", text)):
        yield " ".join(span.split())


def command_lines(words: list[str]) -> Iterator[tuple[tuple[str, ...], list[str]]]:
    """Each `warmfleet` command among `words`: its command path (`("sim", "run")`) and the
    words after it, up to a shell operator. Prose such as `warmfleet up: ready` is none."""
    for i, word in enumerate(words):
        if word != "warmfleet" and not word.endswith("/warmfleet"):
            continue
        path: tuple[str, ...] = ()
        rest = words[i + 1 :]
        while rest and (*path, rest[0]) in known_commands():
            path, rest = (*path, rest[0]), rest[1:]
        if not path and rest[:1] != ["--help"]:
            continue  # a word: `helm install warmfleet ...`, `--peer warmfleet`
        end = next((j for j, w in enumerate(rest) if w in SEPARATORS), len(rest))
        yield path, rest[:end]


def flags_shown() -> list[tuple[str, tuple[str, ...], str]]:
    """(document, command path, flag) for every flag on a `warmfleet` command line."""
    found = []
    for doc in documents():
        text = doc.read_text()
        for fragment in [*fenced_lines(text), *inline_spans(text)]:
            for path, words in command_lines(fragment.split()):
                for word in words:
                    flag = FLAG.match(word)
                    if flag:
                        found.append((str(doc.relative_to(ROOT)), path, flag.group(1)))
    return found


def test_the_commands_are_found() -> None:
    """The reference's enumeration covers the dispatcher, and the docs show many flags:
    a parser that found none would pass the test below vacuously."""
    assert {("serve",), ("service", "install"), ("sim", "run"), ("warm-prompts", "capture")} <= (
        known_commands()
    )
    shown = flags_shown()
    assert len(shown) > 150
    assert {path for _, path, _ in shown} >= {("serve",), ("up",), ("router",), ("bench-serve",)}


def test_every_flag_shown_is_in_its_commands_help() -> None:
    missing = sorted(
        {
            f"{doc}: warmfleet {' '.join(path)} {flag}"
            for doc, path, flag in flags_shown()
            if not re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", help_of(path))
        }
    )
    assert not missing, "\n".join(missing)


def getting_started_commands() -> list[list[str]]:
    """The guide's fenced `warmfleet` commands, as the shell would split them."""
    return [
        [*path, *words]
        for line in fenced_lines(GETTING_STARTED.read_text())
        for path, words in command_lines(shlex.split(line))
    ]


def test_the_getting_started_commands_parse() -> None:
    from warmfleet_cli.main import main

    commands = getting_started_commands()
    assert len(commands) >= 2 and commands[0][:3] == ["up", "--nodes", "2"]
    for argv in commands:
        out = io.StringIO()
        with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as done:
            main([*argv, "--help"])
        assert done.value.code == 0, argv
        assert out.getvalue().startswith("usage: warmfleet"), argv


def test_the_readme_is_short_and_says_the_two_commands() -> None:
    text = README.read_text()
    assert len(text.splitlines()) < 300
    first_fence = FENCE.findall(text.split("```mermaid", 1)[1].split("```", 1)[1])[0]
    assert first_fence.startswith("make run ") and "\nmake test " in first_fence


def _ready_block(text: str) -> str:
    fence: str = next(b for b in FENCE.findall(text) if "warmfleet up: ready:" in b)
    return fence[fence.index("warmfleet up: ready:") :].rstrip("\n")


def test_make_runs_ready_block_is_what_up_prints() -> None:
    from warmfleet_cli.up import ready_block

    printed = ready_block("http://127.0.0.1:8000", 2, 32768)
    assert _ready_block(README.read_text()) == printed
    assert _ready_block(GETTING_STARTED.read_text()) == printed
    # The README's one agent is the block's Claude Code line.
    claude = next(line for line in printed.splitlines() if "Claude Code " in line)
    lines = fenced_lines(README.read_text())
    shown = next(line for line in lines if line.startswith("ANTHROPIC_BASE_URL="))
    assert " ".join(shown.split()) == claude.split("Claude Code", 1)[1].strip()


def test_the_docs_show_the_readmes_fleet_picture() -> None:
    readme = README.read_text()
    section = readme.split("--8<-- [start:fleet]", 1)[1].split("--8<-- [end:fleet]", 1)[0]
    assert "```mermaid\nflowchart" in section
    assert '--8<-- "README.md:fleet"' in (DOCS / "index.md").read_text()
