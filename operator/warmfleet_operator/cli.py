"""`warmfleet operator`: kopf against the cluster (kubeconfig or in-cluster), or
local mode against a folder of YAML files."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from warmfleet_common.tls import TlsOptions


def add_arguments(p: argparse.ArgumentParser) -> None:
    scope = p.add_mutually_exclusive_group()
    scope.add_argument("--all-namespaces", "-A", action="store_true", help="watch every namespace")
    scope.add_argument(
        "--namespace", "-n", action="append", default=[], help="watch this namespace (repeatable)"
    )
    scope.add_argument(
        "--local", metavar="DIR", help="no Kubernetes: reconcile the YAML files in DIR"
    )
    p.add_argument("--status-file", help="local mode: write every status here (JSON)")
    p.add_argument("--once", action="store_true", help="local mode: one pass, then exit")
    p.add_argument(
        "--liveness",
        default="http://127.0.0.1:8080/healthz",
        help="kopf's liveness endpoint (empty to disable; in a pod, "
        "http://0.0.0.0:8080/healthz so the kubelet can reach it)",
    )
    p.add_argument(
        "--operator-namespace",
        help="where Secrets referenced without a namespace are read (default: "
        "$WARMFLEET_OPERATOR_NAMESPACE, else the pod's or the kubeconfig context's namespace)",
    )
    p.add_argument("--resync-seconds", type=float, default=30.0, help="drift-repair period")
    p.add_argument(
        "--probe-seconds",
        type=float,
        default=5.0,
        help="WarmNode probe period when settled (0.5 s while warming or unreachable)",
    )
    p.add_argument(
        "--tls-ca",
        metavar="FILE",
        help="verify the daemons' certificates with this CA bundle (ca.crt; default: the "
        "system's CAs, for https WarmNode URLs)",
    )
    p.add_argument(
        "--tls-cert",
        metavar="FILE",
        help="a client certificate presented to daemons that ask for one (mTLS; read again "
        "when it changes)",
    )
    p.add_argument("--tls-key", metavar="FILE", help="its key")
    p.add_argument("--verbose", action="store_true")


def run(args: argparse.Namespace) -> int:
    from warmfleet_common.tls import TlsOptions

    tls = TlsOptions(args.tls_cert, args.tls_key, args.tls_ca)
    problem = tls.problem()
    if problem:
        print(f"warmfleet operator: {problem}")
        return 2
    if args.local:
        logging.basicConfig(
            level=logging.DEBUG if args.verbose else logging.INFO,
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        )
        _quiet_http_client()
        return _run_local(Path(args.local), args, tls)
    import kopf

    import warmfleet_operator.handlers  # noqa: F401  (registers the handlers)
    from warmfleet_operator.config import OperatorConfig

    config = OperatorConfig(
        resync_seconds=args.resync_seconds,
        probe_seconds=args.probe_seconds,
        # The chart sets WARMFLEET_OPERATOR_NAMESPACE to the pod's namespace.
        operator_namespace=args.operator_namespace
        or os.environ.get("WARMFLEET_OPERATOR_NAMESPACE")
        or None,
        tls=tls,
    )

    kopf.configure(verbose=args.verbose)  # kopf's own log format, one handler
    _quiet_http_client()
    kopf.run(
        clusterwide=args.all_namespaces or not args.namespace,
        namespaces=args.namespace,
        liveness_endpoint=args.liveness or None,
        standalone=True,
        memo=kopf.Memo(config=config),
    )
    return 0


def _quiet_http_client() -> None:
    # One line per daemon call otherwise; failures are logged by the client itself.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("httpcore").setLevel(logging.INFO)


def _run_local(directory: Path, args: argparse.Namespace, tls: TlsOptions) -> int:
    from warmfleet_common.tls import client_verify
    from warmfleet_operator.local import run_local

    if not directory.is_dir():
        print(f"warmfleet operator: {directory} is not a directory")
        return 2
    status_file = (
        Path(args.status_file) if args.status_file else directory / "warmfleet-status.json"
    )

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await run_local(
            directory,
            resync=args.resync_seconds,
            status_file=status_file,
            once=args.once,
            stop=stop,
            verify=client_verify(tls),
        )

    asyncio.run(main())
    return 0
