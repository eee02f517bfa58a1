"""The command-line side of running on a Mac in a fleet: `serve --register NAME`'s
flags, and `warmfleet service install/uninstall`. warmfleet_daemon.cli wires them in."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from warmfleet_daemon.node.registration import Registration
    from warmfleet_daemon.node.units import ServiceSpec
    from warmfleet_daemon.settings import DaemonSettings

log = logging.getLogger("warmfleet")
AddArguments = Callable[[argparse.ArgumentParser], None]
# serve options naming files: made absolute when a service is installed (it runs elsewhere)
PATH_OPTIONS = (
    "admin_token_file",
    "api_keys_file",
    "tls_cert",
    "tls_key",
    "tls_ca",
    "tls_client_ca",
    "tls_client_cert",
    "tls_client_key",
    "warm_prompts",
    "state_dir",
    "kubeconfig",
)


# -- serve --register -------------------------------------------------------------------


def add_register_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "joining a Kubernetes fleet",
        "create or update this daemon's own WarmNode at start (never deletes anything)",
    )
    g.add_argument(
        "--register",
        metavar="NAME",
        help="this daemon's WarmNode name (with --engine sim --nodes: NAME-I for each)",
    )
    g.add_argument(
        "--advertise-url",
        metavar="URL",
        help="where the operator reaches this daemon (default: http://HOSTNAME:PORT; "
        "with --nodes, {port} stands for each daemon's port)",
    )
    g.add_argument("--labels", metavar="K=V[,K=V..]", help="labels of the WarmNode (pools to join)")
    g.add_argument(
        "--admin-token-secret",
        metavar="[NAMESPACE/]NAME[:KEY]",
        help="the Secret holding this daemon's admin token, for the operator "
        "(the chart's: RELEASE-NAMESPACE/RELEASE-warmfleet-admin-token:token)",
    )
    g.add_argument(
        "--kubeconfig", metavar="FILE", help="credentials (default: KUBECONFIG, ~/.kube/config)"
    )


def registration(args: argparse.Namespace, settings: DaemonSettings) -> Registration | None:
    """The registration the flags ask for; RegistrationError if they are inconsistent."""
    from warmfleet_daemon.node.registration import (
        Registration,
        RegistrationError,
        default_url,
        parse_labels,
        parse_secret_ref,
        physical_memory_bytes,
    )

    if not args.register:
        given = [
            flag
            for flag, value in (
                ("--advertise-url", args.advertise_url),
                ("--labels", args.labels),
                ("--admin-token-secret", args.admin_token_secret),
                ("--kubeconfig", args.kubeconfig),
            )
            if value
        ]
        if given:
            raise RegistrationError(f"{', '.join(given)} only apply with --register NAME")
        return None
    return Registration(
        name=args.register,
        url=(args.advertise_url or default_url(settings.host, settings.port)).rstrip("/"),
        labels=parse_labels(args.labels),
        model=settings.served_model_name or settings.model,
        memory_bytes=physical_memory_bytes(),
        cache_budget_bytes=settings.cache_budget_bytes(),
        token_ref=parse_secret_ref(args.admin_token_secret) if args.admin_token_secret else None,
    )


def register_members_if_asked(
    args: argparse.Namespace, members: list[DaemonSettings]
) -> str | None:
    """`serve --engine sim --nodes N --register PREFIX`: each simulated daemon registers
    its own WarmNode, named as it is (`PREFIX-I`), at `--advertise-url` with `{port}`
    made its port; an error message if one failed (those before it stay registered)."""
    from warmfleet_daemon.node.registration import RegistrationError, register

    if not args.register:
        return None
    template = args.advertise_url
    if template is not None and "{port}" not in template:
        return (
            "--advertise-url with --nodes: put {port} where each daemon's port goes "
            "(http://HOST:{port})"
        )
    try:
        for member in members:
            one = argparse.Namespace(**vars(args))
            one.register = member.daemon_name
            one.advertise_url = template.replace("{port}", str(member.port)) if template else None
            reg = registration(one, member)
            if reg is not None:
                register(reg, kubeconfig=args.kubeconfig)
    except RegistrationError as exc:
        return str(exc)
    log.info("registered %d WarmNodes, %s to %s", len(members),
             members[0].daemon_name, members[-1].daemon_name)  # fmt: skip
    return None


def register_if_asked(args: argparse.Namespace, settings: DaemonSettings) -> str | None:
    """Register this daemon's WarmNode when --register is given; an error message if that
    failed (nothing else is changed then), None otherwise."""
    from warmfleet_daemon.node.registration import RegistrationError, register, summary

    try:
        reg = registration(args, settings)
        if reg is not None:
            outcome = register(reg, kubeconfig=args.kubeconfig)
            log.info("%s", summary(reg, outcome))
    except RegistrationError as exc:
        return str(exc)
    return None


# -- service install / uninstall ----------------------------------------------------------


def add_service_arguments(service: argparse.ArgumentParser, serve_arguments: AddArguments) -> None:
    service.description = (
        "Install the daemon as a service that starts at login (or boot, with "
        "--system) and restarts when it exits, or remove it."
    )
    verbs = service.add_subparsers(dest="service_command", required=True)
    install = verbs.add_parser(
        "install",
        help="write the LaunchAgent/LaunchDaemon or systemd unit and start it",
        description="Every `warmfleet serve` option is accepted and checked now, e.g. "
        "`warmfleet service install --host 0.0.0.0 --admin-token-file ~/.warmfleet/token "
        "--register mac-mini-1 --labels warmfleet.io/pool=agents`.",
    )
    _manager_arguments(install)
    install.add_argument(
        "--env", action="append", default=[], metavar="K=V", help="environment (repeatable)"
    )
    install.add_argument("--log-dir", metavar="DIR", help="launchd: stdout/stderr files here")
    install.add_argument("--run-as", metavar="USER", help="--system: the user to run as")
    install.add_argument(
        "--dry-run", action="store_true", help="print the definition instead of installing it"
    )
    serve_arguments(install)
    uninstall = verbs.add_parser("uninstall", help="stop the service and remove its definition")
    _manager_arguments(uninstall)


def _manager_arguments(p: argparse.ArgumentParser) -> None:
    kind = p.add_mutually_exclusive_group()
    kind.add_argument(
        "--launchd", dest="manager", action="store_const", const="launchd", help="macOS"
    )
    kind.add_argument(
        "--systemd", dest="manager", action="store_const", const="systemd", help="Linux"
    )
    p.add_argument(
        "--name", default="daemon", help="io.warmfleet.NAME / warmfleet-NAME.service (daemon)"
    )
    p.add_argument(
        "--system",
        action="store_true",
        help="a LaunchDaemon or system unit (at boot, as root or --run-as) "
        "instead of a LaunchAgent or user unit (at login)",
    )
    p.add_argument("--unit-dir", metavar="DIR", help="write the definition here instead")
    p.add_argument(
        "--no-start",
        action="store_true",
        help="only write or remove the file; do not call launchctl or systemctl",
    )


def run_service(args: argparse.Namespace, serve_arguments: AddArguments) -> int:
    from warmfleet_daemon.node.install import (
        Manager,
        ServiceError,
        default_kind,
        default_unit_dir,
        install,
        run_checked,
        uninstall,
    )

    prog = f"warmfleet service {args.service_command}"
    try:
        kind = args.manager or default_kind()
        unit_dir = (
            Path(args.unit_dir).expanduser().absolute()
            if args.unit_dir
            else default_unit_dir(kind, args.system)
        )
        manager = Manager(kind, unit_dir)
        if args.service_command == "uninstall":
            from warmfleet_daemon.node.units import ServiceSpec

            spec = ServiceSpec(name=_checked_name(args.name), command=[], system=args.system)
            removed = uninstall(manager, spec, stop=not args.no_start, run=run_checked)
            print(
                f"removed {removed}" if removed else f"nothing to remove: no {manager.path(spec)}"
            )
            return 0
        spec = _install_spec(args, serve_arguments, kind)
        if args.dry_run:
            sys.stdout.write(manager.render(spec).decode())
            return 0
        path = install(manager, spec, start=not args.no_start, run=run_checked)
    except ServiceError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    started = "" if args.no_start else " and started"
    print(f"installed{started} {path}")
    if kind == "launchd" and spec.log_dir is not None:
        print(f"logs: {spec.log_dir}/{spec.name}.err.log")
    elif kind == "systemd":
        scope = "" if args.system else " --user"
        print(f"logs: journalctl{scope} -u {spec.unit_name} -f")
        if not args.system:
            print("a user unit starts at login; `loginctl enable-linger` starts it at boot")
    return 0


def _install_spec(
    args: argparse.Namespace, serve_arguments: AddArguments, kind: str
) -> ServiceSpec:
    from pydantic import ValidationError

    from warmfleet_daemon.node.install import ServiceError, default_log_dir
    from warmfleet_daemon.node.registration import RegistrationError
    from warmfleet_daemon.node.units import ServiceSpec
    from warmfleet_daemon.settings import DaemonSettings

    environment = {"PYTHONUNBUFFERED": "1"}
    for item in args.env:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ServiceError(f"--env {item!r}: expected KEY=VALUE")
        environment[key] = value
    if args.run_as and not args.system:
        raise ServiceError("--run-as only applies with --system")
    for flag, path in (
        ("--admin-token-file", args.admin_token_file),
        ("--api-keys-file", args.api_keys_file),
        ("--warm-prompts", args.warm_prompts),
        ("--kubeconfig", args.kubeconfig),
    ):
        if path and not os.path.isfile(os.path.expanduser(path)):
            raise ServiceError(f"{flag} {path}: no such file (the service would fail to start)")
    serve_args = serve_command_line(args, serve_arguments)
    # What `serve` would refuse at every start, refused now instead.
    try:
        fields = DaemonSettings.model_fields
        overrides = {
            k: v
            for k, v in vars(args).items()
            if v is not None and k in fields and k != "log_level"
        }
        settings = DaemonSettings(**overrides)
        tls_problem = settings.tls().problem()  # files missing, or a pair that does not load
        if tls_problem:
            raise ServiceError(f"{tls_problem} (the service would fail to start)")
        if not settings.binds_loopback() and not (
            args.admin_token_file or "WARMFLEET_ADMIN_TOKEN" in environment
        ):
            raise ServiceError(
                f"the daemon would listen on {settings.host} without an admin token and "
                "refuse to start: add --admin-token-file FILE"
            )
        registration(args, settings)
    except (ValidationError, RegistrationError) as exc:
        raise ServiceError(str(exc)) from exc
    system = bool(args.system)
    return ServiceSpec(
        name=_checked_name(args.name),
        command=[*_program(), "serve", *serve_args],
        environment=environment,
        working_directory=None if system else Path.home(),
        log_dir=(
            (
                Path(args.log_dir).expanduser().absolute()
                if args.log_dir
                else default_log_dir(system)
            )
            if kind == "launchd"
            else None
        ),
        system=system,
        run_as=args.run_as,
    )


def serve_command_line(args: argparse.Namespace, serve_arguments: AddArguments) -> list[str]:
    """The `serve` options given to `service install`, as a command line (paths made
    absolute: the service does not run in this directory)."""
    scratch = argparse.ArgumentParser(add_help=False)
    serve_arguments(scratch)
    argv: list[str] = []
    # argparse has no public list of a parser's actions.
    for action in scratch._actions:
        if not action.option_strings:
            continue
        value = getattr(args, action.dest, None)
        if value is None or value == action.default:
            continue
        flag = max(action.option_strings, key=len)
        if isinstance(action, argparse._StoreTrueAction):
            argv.append(flag)
            continue
        values = value if isinstance(value, list) else [value]
        for v in values:
            text = str(v)
            if action.dest in PATH_OPTIONS or (action.dest == "model" and os.path.exists(text)):
                text = str(Path(text).expanduser().absolute())
            argv.append(f"{flag}={text}")
    return argv


def _program() -> Sequence[str]:
    script = Path(sys.executable).with_name("warmfleet")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "warmfleet_cli"]


def _checked_name(name: str) -> str:
    from warmfleet_daemon.node.install import ServiceError

    if not name or not all(c.isalnum() or c in "-_." for c in name):
        raise ServiceError(f"--name {name!r}: letters, digits, '-', '_' and '.' only")
    return name
