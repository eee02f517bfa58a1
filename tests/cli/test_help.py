"""`warmfleet` keeps its command line as users know it, and loads only what a subcommand
needs: the dispatcher imports a subcommand's module when that subcommand runs."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from warmfleet_cli.main import main

HELP = Path(__file__).with_name("help")
COMMANDS = [
    (),
    ("serve",),
    ("service",),
    ("service", "install"),
    ("service", "uninstall"),
    ("convert",),
    ("bench-serve",),
    ("bench-compare",),
    ("audit",),
    ("operator",),
    ("router",),
    ("up",),
    ("sim",),
    ("sim", "trace"),
    ("sim", "replay"),
    ("sim", "report"),
    ("sim", "run"),
    ("plan",),
    ("warm-prompts",),
    ("warm-prompts", "capture"),
]


def _help(argv: tuple[str, ...]) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as done:
        main([*argv, "--help"])
    assert done.value.code == 0
    return out.getvalue()


@pytest.mark.parametrize("argv", COMMANDS, ids=lambda argv: " ".join(argv) or "warmfleet")
def test_help_is_what_it_was(argv: tuple[str, ...], monkeypatch: pytest.MonkeyPatch) -> None:
    """Every subcommand's usage, options and texts, as recorded in tests/cli/help/ (to
    change one on purpose, change its file in the same commit)."""
    monkeypatch.setenv("COLUMNS", "100")
    expected = (HELP / (("_".join(argv) or "warmfleet") + ".txt")).read_text()
    assert _help(argv) == expected


def _modules_loaded_by(argv: list[str]) -> list[str]:
    code = (
        "import json, sys\n"
        "from warmfleet_cli.main import main\n"
        "try:\n"
        f"    main({argv!r})\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    return list(json.loads(done.stdout.splitlines()[-1]))


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["router", "--help"],
        ["operator", "--help"],
        ["bench-serve", "--help"],
        ["warm-prompts", "capture", "--help"],
        ["sim", "trace", "--help"],
        ["sim", "report", "--help"],
    ],
)
def test_a_subcommand_loads_only_what_it_needs(argv: list[str]) -> None:
    loaded = _modules_loaded_by(argv)
    heavy = {"mlx", "mlx_lm", "kopf"} if argv[0] != "operator" else {"mlx", "mlx_lm"}
    assert not [m for m in loaded if m.split(".")[0] in heavy]
    others = {
        "router": {"warmfleet_daemon", "warmfleet_operator"},
        "operator": {"warmfleet_daemon", "warmfleet_router"},
    }.get(argv[0], {"warmfleet_daemon", "warmfleet_operator", "warmfleet_router"})
    assert not [m for m in loaded if m.split(".")[0] in others]
