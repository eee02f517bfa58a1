"""The house rules `lint-imports` cannot state: every module of every package sits in a
layers contract (itself or a sub-package it is in), so no module escapes the layering;
and no source file grows past 600 lines (a room that crowded wants splitting by job)."""

from __future__ import annotations

import ast
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {
    "warmfleet_common": ROOT / "common",
    "warmfleet_daemon": ROOT / "daemon",
    "warmfleet_operator": ROOT / "operator",
    "warmfleet_router": ROOT / "router",
    "warmfleet_cli": ROOT / "cli",
}
MAX_LINES = 600


def modules(package: str) -> list[str]:
    """Every module and sub-package of `package` (dotted names, the package excluded),
    but sub-packages that only contain (their `__init__` imports nothing)."""
    base = PACKAGES[package]
    found = []
    for path in sorted((base / package).rglob("*.py")):
        parts = path.relative_to(base).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
            if not imports_anything(path):
                continue
        if len(parts) > 1:
            found.append(".".join(parts))
    return found


def imports_anything(path: Path) -> bool:
    tree = ast.parse(path.read_text())
    return any(isinstance(node, ast.Import | ast.ImportFrom) for node in ast.walk(tree))


def layered() -> set[str]:
    """The modules named in a layer of some layers contract."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    named: set[str] = set()
    for contract in config["tool"]["importlinter"]["contracts"]:
        if contract["type"] != "layers":
            continue
        for layer in contract["layers"]:
            named.update(m.strip() for m in layer.replace(":", "|").split("|"))
    return named


def test_every_module_is_in_a_layers_contract_below_its_package() -> None:
    named = layered()
    outside = [
        module
        for package in PACKAGES
        for module in modules(package)
        if not any(module == n or module.startswith(n + ".") for n in named if n not in PACKAGES)
    ]
    assert outside == []


def test_no_source_file_is_over_600_lines() -> None:
    sources = [
        path
        for folder in (*PACKAGES.values(), ROOT / "bench", ROOT / "tests", ROOT / "scripts")
        for path in folder.rglob("*.py")
    ]
    assert sources
    long = {
        str(path.relative_to(ROOT)): lines
        for path in sources
        if (lines := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}
