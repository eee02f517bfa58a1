"""Writing, loading, unloading and removing the service definitions: the only module of
`warmfleet service` that touches files and runs launchctl or systemctl."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from warmfleet_daemon.node.units import ServiceSpec, launchd_bytes, systemd_unit

Runner = Callable[[Sequence[str]], None]


class ServiceError(Exception):
    """The service cannot be installed or removed as asked."""


@dataclass(frozen=True)
class Manager:
    kind: str  # "launchd" | "systemd"
    unit_dir: Path

    def path(self, spec: ServiceSpec) -> Path:
        name = f"{spec.label}.plist" if self.kind == "launchd" else spec.unit_name
        return self.unit_dir / name

    def render(self, spec: ServiceSpec) -> bytes:
        return launchd_bytes(spec) if self.kind == "launchd" else systemd_unit(spec).encode()


def default_kind() -> str:
    if sys.platform == "darwin":
        return "launchd"
    if sys.platform.startswith("linux"):
        return "systemd"
    raise ServiceError(f"no service manager known on {sys.platform}: pass --launchd or --systemd")


def default_unit_dir(kind: str, system: bool) -> Path:
    if kind == "launchd":
        return Path("/Library/LaunchDaemons") if system else _home() / "Library/LaunchAgents"
    if system:
        return Path("/etc/systemd/system")
    config = os.environ.get("XDG_CONFIG_HOME") or str(_home() / ".config")
    return Path(config) / "systemd/user"


def default_log_dir(system: bool) -> Path:
    return Path("/Library/Logs/warmfleet") if system else _home() / "Library/Logs/warmfleet"


def install(manager: Manager, spec: ServiceSpec, *, start: bool, run: Runner) -> Path:
    """Write the definition (replacing an older one, atomically) and, with `start`, load
    it now; it starts by itself at every boot or login from then on."""
    path = manager.path(spec)
    path.parent.mkdir(parents=True, exist_ok=True)
    if spec.log_dir is not None:
        spec.log_dir.mkdir(parents=True, exist_ok=True)
    replacing = path.exists()
    if replacing and start:
        _unload(manager, spec, path, run, missing_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(manager.render(spec))
    tmp.replace(path)
    if start:
        if manager.kind == "launchd":
            run(["launchctl", "bootstrap", _launchd_domain(spec), str(path)])
        else:
            ctl = _systemctl(spec)
            run([*ctl, "daemon-reload"])
            run([*ctl, "enable", "--now", spec.unit_name])
    return path


def uninstall(manager: Manager, spec: ServiceSpec, *, stop: bool, run: Runner) -> Path | None:
    """Stop the service and remove its definition; None if none was installed."""
    path = manager.path(spec)
    if not path.exists():
        return None
    if stop:
        _unload(manager, spec, path, run, missing_ok=True)
    path.unlink()
    if stop and manager.kind == "systemd":
        run([*_systemctl(spec), "daemon-reload"])
    return path


def run_checked(argv: Sequence[str]) -> None:
    done = subprocess.run(list(argv), capture_output=True, text=True)
    if done.returncode != 0:
        raise ServiceError(f"{' '.join(argv)}: {(done.stderr or done.stdout).strip()}")


def _unload(manager: Manager, spec: ServiceSpec, path: Path, run: Runner, missing_ok: bool) -> None:
    try:
        if manager.kind == "launchd":
            run(["launchctl", "bootout", f"{_launchd_domain(spec)}/{spec.label}"])
        else:
            run([*_systemctl(spec), "disable", "--now", spec.unit_name])
    except ServiceError:
        if not missing_ok:
            raise


def _launchd_domain(spec: ServiceSpec) -> str:
    return "system" if spec.system else f"gui/{os.getuid()}"


def _systemctl(spec: ServiceSpec) -> list[str]:
    return ["systemctl"] if spec.system else ["systemctl", "--user"]


def _home() -> Path:
    return Path(os.path.expanduser("~"))
