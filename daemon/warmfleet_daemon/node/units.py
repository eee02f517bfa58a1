"""The service definitions themselves, as data: a launchd property list (written with
plistlib) and a systemd unit. Pure: no files, no processes."""

from __future__ import annotations

import contextlib
import math
import plistlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DESCRIPTION = "warmfleet daemon: OpenAI-compatible API with a warm prefix cache"
# SIGTERM drains (--drain-seconds, 10 s by default: peers copy its sessions), then uvicorn
# finishes requests (5 s) and the disk tier saves RAM's blocks (up to 30 s): the service
# manager waits that long, plus slack, before SIGKILL.
DEFAULT_DRAIN_SECONDS = 10.0
STOP_AFTER_DRAIN_SECONDS = 50


@dataclass(frozen=True)
class ServiceSpec:
    """One daemon to run as a service: its command line and surroundings."""

    name: str  # launchd label io.warmfleet.NAME, systemd unit warmfleet-NAME.service
    command: Sequence[str]  # the absolute program, then `serve` and its options
    environment: Mapping[str, str] = field(default_factory=dict)
    working_directory: Path | None = None
    log_dir: Path | None = None  # launchd only: systemd logs to the journal
    system: bool = False  # LaunchDaemon / system unit (boot) instead of per-user (login)
    run_as: str | None = None  # the user of a system service

    @property
    def label(self) -> str:
        return f"io.warmfleet.{self.name}"

    @property
    def unit_name(self) -> str:
        return f"warmfleet-{self.name}.service"

    @property
    def stop_timeout(self) -> int:
        """Seconds between SIGTERM and SIGKILL: the daemon's drain, then its shutdown."""
        drain = DEFAULT_DRAIN_SECONDS
        args = list(self.command)
        for i, arg in enumerate(args):
            value = args[i + 1] if arg == "--drain-seconds" and i + 1 < len(args) else None
            if arg.startswith("--drain-seconds="):
                value = arg.split("=", 1)[1]
            if value is not None:
                with contextlib.suppress(ValueError):  # serve refuses it at install
                    drain = max(0.0, float(value))
        return math.ceil(drain) + STOP_AFTER_DRAIN_SECONDS


def launchd_plist(spec: ServiceSpec) -> dict[str, Any]:
    plist: dict[str, Any] = {
        "Label": spec.label,
        "ProgramArguments": list(spec.command),
        "RunAtLoad": True,
        # Restarted whenever it exits; launchd waits ThrottleInterval between starts.
        "KeepAlive": True,
        "ThrottleInterval": 10,
        # Not throttled like a background job: it serves interactive requests (Metal).
        "ProcessType": "Interactive",
        # launchd's default of 20 s before SIGKILL is shorter than a drain (SIGTERM).
        "ExitTimeOut": spec.stop_timeout,
    }
    if spec.environment:
        plist["EnvironmentVariables"] = dict(spec.environment)
    if spec.working_directory is not None:
        plist["WorkingDirectory"] = str(spec.working_directory)
    if spec.log_dir is not None:
        plist["StandardOutPath"] = str(spec.log_dir / f"{spec.name}.out.log")
        plist["StandardErrorPath"] = str(spec.log_dir / f"{spec.name}.err.log")
    if spec.system and spec.run_as:
        plist["UserName"] = spec.run_as
    return plist


def launchd_bytes(spec: ServiceSpec) -> bytes:
    return plistlib.dumps(launchd_plist(spec), fmt=plistlib.FMT_XML, sort_keys=False)


def systemd_unit(spec: ServiceSpec) -> str:
    lines = [
        "[Unit]",
        f"Description={DESCRIPTION} ({spec.name})",
        "Wants=network-online.target",
        "After=network-online.target",
        "",
        "[Service]",
        "Type=exec",
        "ExecStart=" + " ".join(systemd_quote(arg) for arg in spec.command),
    ]
    lines += [
        f"Environment={systemd_quote(f'{k}={v}')}" for k, v in sorted(spec.environment.items())
    ]
    if spec.working_directory is not None:
        lines.append(f"WorkingDirectory={systemd_quote(str(spec.working_directory))}")
    if spec.system and spec.run_as:
        lines.append(f"User={spec.run_as}")
    lines += [
        "Restart=always",
        "RestartSec=5",
        f"TimeoutStopSec={spec.stop_timeout}",
        "NoNewPrivileges=yes",
        "",
        "[Install]",
        f"WantedBy={'multi-user.target' if spec.system else 'default.target'}",
        "",
    ]
    return "\n".join(lines)


_PLAIN = re.compile(r"^[A-Za-z0-9_@%+=:,./-]+$")


def systemd_quote(arg: str) -> str:
    """One argument as systemd's command-line and Environment= parsers read it:
    specifiers (%) and variables ($) escaped, double quotes around anything else."""
    escaped = arg.replace("%", "%%").replace("$", "$$")
    if _PLAIN.match(arg) and escaped == arg:
        return arg
    escaped = escaped.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'
