"""Prints the e2e suite's measured times (recorded with `record_property`)."""

from __future__ import annotations

from typing import Any


def pytest_terminal_summary(terminalreporter: Any) -> None:
    lines = [
        f"{name}: {value}"
        for report in terminalreporter.stats.get("passed", [])
        if report.when == "call"
        for name, value in report.user_properties
        if name.startswith("e2e timing")
    ]
    if lines:
        terminalreporter.section("e2e timings")
        for line in lines:
            terminalreporter.line(line)
