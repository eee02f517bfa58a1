"""`warmfleet service install/uninstall`: the launchd plist read back with plistlib, the
systemd unit checked by systemd's own `systemd-analyze verify`, the serve options carried
over (and checked at install time), and uninstall removing exactly what install wrote."""

from __future__ import annotations

import plistlib
import shutil
import subprocess
from pathlib import Path

import pytest

from warmfleet_cli.main import main
from warmfleet_daemon.node.install import Manager, install, uninstall
from warmfleet_daemon.node.units import ServiceSpec, systemd_quote, systemd_unit

needs_systemd = pytest.mark.skipif(
    shutil.which("systemd-analyze") is None,
    reason="systemd-analyze not installed (scripts/setup.sh --test-tools installs systemd)",
)


@pytest.fixture
def token(tmp_path: Path) -> Path:
    path = tmp_path / "admin-token"
    path.write_text("s3cret\n")
    return path


def _install(tmp_path: Path, *args: str) -> int:
    return main(["service", "install", "--unit-dir", str(tmp_path / "units"), "--no-start", *args])


def test_launchd_plist(tmp_path: Path, token: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "warm.yaml").write_text("- name: a\n  messages: [{role: system, content: hi}]\n")
    code = _install(
        tmp_path,
        "--launchd",
        "--log-dir", str(tmp_path / "logs"),
        "--env", "OTEL_EXPORTER_OTLP_ENDPOINT=http://otel:4318",
        "--host", "0.0.0.0",
        "--port", "8123",
        "--admin-token-file", "admin-token",  # relative: made absolute
        "--warm-prompts", "warm.yaml",
        "--cache-memory-mb", "4096",
        "--register", "mac-mini-1",
        "--labels", "warmfleet.io/pool=agents",
    )  # fmt: skip
    assert code == 0
    path = tmp_path / "units" / "io.warmfleet.daemon.plist"
    with path.open("rb") as f:
        plist = plistlib.load(f)
    assert plist["Label"] == "io.warmfleet.daemon"
    assert plist["RunAtLoad"] is True and plist["KeepAlive"] is True
    assert plist["ExitTimeOut"] == 60  # launchd's 20 s default would cut the drain short
    assert plist["StandardOutPath"] == str(tmp_path / "logs" / "daemon.out.log")
    assert plist["StandardErrorPath"] == str(tmp_path / "logs" / "daemon.err.log")
    assert (tmp_path / "logs").is_dir()
    assert plist["EnvironmentVariables"] == {
        "PYTHONUNBUFFERED": "1",
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://otel:4318",
    }
    program, *argv = plist["ProgramArguments"]
    assert Path(program).is_absolute() and Path(program).exists()
    assert argv == [
        "serve",
        "--host=0.0.0.0",
        "--port=8123",
        "--cache-memory-mb=4096",
        f"--warm-prompts={tmp_path / 'warm.yaml'}",
        f"--admin-token-file={token}",
        "--register=mac-mini-1",
        "--labels=warmfleet.io/pool=agents",
    ]
    assert "UserName" not in plist


def test_the_service_command_line_is_what_serve_parses(tmp_path: Path, token: Path) -> None:
    """The ProgramArguments parse back, with `warmfleet serve`'s own parser, to the options
    given to `service install`."""
    assert (
        _install(
            tmp_path,
            "--launchd",
            "--host",
            "0.0.0.0",
            "--admin-token-file",
            str(token),
            "--max-num-seqs",
            "8",
            "--default-temperature",
            "0.5",
        )
        == 0
    )
    plist = plistlib.loads((tmp_path / "units" / "io.warmfleet.daemon.plist").read_bytes())
    program = plist["ProgramArguments"]
    done = subprocess.run(
        [*program, "--help"], capture_output=True, text=True, timeout=120
    )  # the recorded program runs (and knows `serve`)
    assert done.returncode == 0 and "--register" in done.stdout
    import argparse

    from warmfleet_daemon.cli import add_serve_arguments

    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    args = parser.parse_args(program[program.index("serve") + 1 :])
    assert (args.host, args.max_num_seqs, args.default_temperature) == ("0.0.0.0", 8, 0.5)
    assert args.admin_token_file == str(token)


def test_certificate_files_become_absolute_paths(
    tmp_path: Path, token: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """cert-manager's Secret layout, copied next to the daemon: relative paths made
    absolute, as for every file a service reads."""
    from warmfleet_cli.local_ca import make_local_ca

    monkeypatch.chdir(tmp_path)
    make_local_ca(tmp_path / "tls")
    (tmp_path / "keys").write_text("team-a sk-team-a-0123456789abcdef\n")
    code = _install(
        tmp_path, "--systemd", "--host", "0.0.0.0", "--admin-token-file", str(token),
        "--tls-cert", "tls/tls.crt", "--tls-key", "tls/tls.key", "--tls-ca", "tls/ca.crt",
        "--tls-client-ca", "tls/ca.crt", "--api-keys-file", "keys",
    )  # fmt: skip
    assert code == 0
    unit = (tmp_path / "units" / "warmfleet-daemon.service").read_text()
    for flag, path in [
        ("--tls-cert", "tls/tls.crt"),
        ("--tls-key", "tls/tls.key"),
        ("--tls-ca", "tls/ca.crt"),
        ("--tls-client-ca", "tls/ca.crt"),
        ("--api-keys-file", "keys"),
    ]:
        assert f"{flag}={tmp_path / path}" in unit


def test_launchdaemon_runs_as_the_given_user(tmp_path: Path) -> None:
    assert _install(tmp_path, "--launchd", "--system", "--run-as", "warmfleet") == 0
    plist = plistlib.loads((tmp_path / "units" / "io.warmfleet.daemon.plist").read_bytes())
    assert plist["UserName"] == "warmfleet"
    assert plist["StandardErrorPath"].startswith("/Library/Logs/warmfleet/")


def test_the_service_manager_waits_out_a_longer_drain(tmp_path: Path) -> None:
    """SIGTERM drains for --drain-seconds before the daemon shuts down: neither launchd
    nor systemd may SIGKILL it during the drain."""
    assert _install(tmp_path, "--launchd", "--drain-seconds", "45") == 0
    plist = plistlib.loads((tmp_path / "units" / "io.warmfleet.daemon.plist").read_bytes())
    assert plist["ExitTimeOut"] == 95
    assert _install(tmp_path, "--systemd", "--drain-seconds", "45") == 0
    assert "TimeoutStopSec=95" in (tmp_path / "units" / "warmfleet-daemon.service").read_text()


@needs_systemd
@pytest.mark.parametrize("system", [False, True], ids=["user", "system"])
def test_systemd_unit_passes_systemd_analyze_verify(
    tmp_path: Path, token: Path, system: bool
) -> None:
    extra = ["--system", "--run-as", "root"] if system else []
    code = _install(
        tmp_path,
        "--systemd",
        "--name", "mac-mini-1",
        *extra,
        "--env", "OTEL_RESOURCE_ATTRIBUTES=team=platform,site=office 2",
        "--env", "ODD=50% of $HOME",
        "--host", "0.0.0.0",
        "--admin-token-file", str(token),
        "--state-dir", str(tmp_path / "state dir"),
        "--served-model-name", "smollm 135m",
    )  # fmt: skip
    assert code == 0
    unit = tmp_path / "units" / "warmfleet-mac-mini-1.service"
    text = unit.read_text()
    assert "Restart=always" in text
    assert ("WantedBy=multi-user.target" if system else "WantedBy=default.target") in text
    assert ("User=root" in text) == system
    done = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    # Not even a warning (an unknown key or a bad quote is only a warning to systemd).
    assert str(unit) not in done.stderr, done.stderr


@needs_systemd
def test_awkward_arguments_are_quoted_so_systemd_accepts_them(tmp_path: Path) -> None:
    """Spaces, quotes, % (specifiers) and $ (variables) in arguments and environment:
    systemd-analyze verify finds the program (a path with a space) and no syntax error."""
    script = tmp_path / "echo args"
    script.write_text('#!/bin/sh\nfor a in "$@"; do echo "[$a]"; done\n')
    script.chmod(0o755)
    spec = ServiceSpec(
        name="t",
        command=[str(script), "a b", 'q"uote', "50%", "$HOME", "back\\slash"],
        environment={"X": "a b", "Y": "1%"},
    )
    unit = tmp_path / "t.service"
    unit.write_text(systemd_unit(spec))
    done = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and str(unit) not in done.stderr, done.stderr
    assert systemd_quote("plain-arg=1") == "plain-arg=1"
    assert systemd_quote("a b") == '"a b"'
    assert systemd_quote("50%") == '"50%%"'
    assert systemd_quote("$HOME") == '"$$HOME"'


def test_uninstall_removes_what_install_wrote(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    units = tmp_path / "units"
    assert _install(tmp_path, "--systemd", "--name", "a") == 0
    assert _install(tmp_path, "--systemd", "--name", "b") == 0
    args = ["service", "uninstall", "--systemd", "--unit-dir", str(units), "--no-start"]
    assert main([*args, "--name", "a"]) == 0
    assert sorted(p.name for p in units.iterdir()) == ["warmfleet-b.service"]
    assert main([*args, "--name", "a"]) == 0
    assert "nothing to remove" in capsys.readouterr().out


def test_install_and_uninstall_call_the_service_manager(tmp_path: Path) -> None:
    calls: list[list[str]] = []
    spec = ServiceSpec(name="daemon", command=["/bin/true"], log_dir=tmp_path / "logs")
    launchd = Manager("launchd", tmp_path)
    install(launchd, spec, start=True, run=lambda argv: calls.append(list(argv)))
    assert calls[-1][:2] == ["launchctl", "bootstrap"] and calls[-1][2].startswith("gui/")
    # Re-installing unloads the old definition first.
    install(launchd, spec, start=True, run=lambda argv: calls.append(list(argv)))
    assert calls[-2][:2] == ["launchctl", "bootout"]
    uninstall(launchd, spec, stop=True, run=lambda argv: calls.append(list(argv)))
    assert calls[-1][:2] == ["launchctl", "bootout"] and not launchd.path(spec).exists()
    calls.clear()
    systemd = Manager("systemd", tmp_path)
    install(systemd, spec, start=True, run=lambda argv: calls.append(list(argv)))
    assert calls == [
        ["systemctl", "--user", "daemon-reload"],
        ["systemctl", "--user", "enable", "--now", "warmfleet-daemon.service"],
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--host", "0.0.0.0"], "without an admin token"),
        (["--admin-token-file", "/nonexistent/token"], "no such file"),
        (["--register", "mac-1"], "no other machine can reach"),  # 127.0.0.1 by default
        (["--register", "Mac_1", "--advertise-url", "http://m:8000"], "DNS-1123"),
        (["--labels", "pool=a"], "only apply with --register"),
        (["--register", "m1", "--advertise-url", "http://m:1", "--labels", "bad"], "--labels"),
        (["--port", "99999"], "port"),
        (["--run-as", "someone"], "--run-as only applies with --system"),
        (["--env", "NOVALUE"], "KEY=VALUE"),
        (["--name", "a/b"], "--name"),
        (["--tls-cert", "/nonexistent/tls.crt", "--tls-key", "/x"], "--tls-cert /nonexistent"),
        (["--tls-cert", "/etc/hostname"], "--tls-cert and --tls-key go together"),
        (["--api-keys-file", "/nonexistent/keys"], "no such file"),
    ],
)
def test_install_refuses_what_serve_would_refuse(
    tmp_path: Path, args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _install(tmp_path, "--systemd", *args) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "units").exists()


def test_dry_run_prints_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _install(tmp_path, "--launchd", "--dry-run") == 0
    out = capsys.readouterr().out
    assert plistlib.loads(out.encode())["Label"] == "io.warmfleet.daemon"
    assert not (tmp_path / "units").exists()


def _readme_service_commands() -> list[list[str]]:
    import shlex

    docs = Path(__file__).resolve().parents[3] / "docs"
    readme = (docs / "operator.md").read_text() + (docs / "security.md").read_text()
    text = readme.replace("\\\n", " ")
    return [
        shlex.split(line.strip())[1:]
        for line in text.splitlines()
        if line.strip().startswith("warmfleet service install ")
    ]


def test_readme_service_commands_are_accepted(tmp_path: Path, token: Path) -> None:
    from warmfleet_cli.local_ca import make_local_ca

    commands = _readme_service_commands()
    assert len(commands) == 3 and any("--register" in c for c in commands)
    assert any("--tls-cert" in c for c in commands)  # the Security section's
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\n")
    certs = make_local_ca(tmp_path / "tls")
    (tmp_path / "api-keys").write_text("team-a sk-team-a-0123456789abcdef\n")
    paths = {
        "~/admin-token": str(token),
        "~/.kube/warmfleet": str(kubeconfig),
        "~/.warmfleet": str(tmp_path / "state"),
        "~/tls/tls.crt": str(certs.cert),
        "~/tls/tls.key": str(certs.key),
        "~/tls/ca.crt": str(certs.ca),
        "~/api-keys": str(tmp_path / "api-keys"),
    }
    for argv in commands:
        argv = [paths.get(a, a) for a in argv]
        assert main([*argv, "--systemd", "--dry-run"]) == 0, argv
