"""`warmfleet serve` (the daemon), `warmfleet service` (the daemon as a launchd or systemd
service) and `warmfleet convert` (a model written as an mlx-lm directory): the daemon's
side of the `warmfleet` command line, which imports this module only for these."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import socket
import sys
from typing import TYPE_CHECKING, Any

from warmfleet_common.heap import freeze_heap
from warmfleet_common.logs import quiet_access_log, setup_logging
from warmfleet_daemon.support.blas import ensure_fast_blas, log_blas

if TYPE_CHECKING:
    from warmfleet_daemon.settings import DaemonSettings

log = logging.getLogger("warmfleet")

GIL_SWITCH_INTERVAL_S = 0.0002  # see serve


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    """`serve`'s options, and `--register NAME`'s (joining a Kubernetes fleet)."""
    from warmfleet_daemon.node.cli import add_register_arguments

    _serve_options(p)
    add_register_arguments(p)


def add_service_arguments(p: argparse.ArgumentParser) -> None:
    from warmfleet_daemon.node.cli import add_service_arguments as add_arguments

    add_arguments(p, add_serve_arguments)


def run_service(args: argparse.Namespace) -> int:
    from warmfleet_daemon.node.cli import run_service as run

    return run(args, add_serve_arguments)


def add_convert_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="default | FILE.gguf | mlx-lm dir | HF id")
    p.add_argument("output", help="directory to write")
    p.add_argument("--dtype", choices=["float32", "float16", "bfloat16"], default="float32")


def _serve_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="default | FILE.gguf | mlx-lm dir | HF id | tiny-random")
    p.add_argument("--served-model-name")
    p.add_argument(
        "--engine",
        choices=["mlx", "sim"],
        help="mlx (default): the model's forward pass; sim: a simulated Mac, each prefill chunk "
        "and decode step taking the time --profile says (the rest is the real daemon)",
    )
    p.add_argument(
        "--profile",
        metavar="NAME|FILE",
        help="--engine sim: a built-in performance profile or a file from bench-serve "
        "--profile-out",
    )
    p.add_argument(
        "--sim-speed",
        type=float,
        metavar="X",
        help="--engine sim: simulated time runs X times faster than the clock (default 1)",
    )
    p.add_argument(
        "--sim-answer-tokens",
        type=int,
        metavar="N",
        help="--engine sim: answers end after N tokens unless max_tokens is lower (default 64)",
    )
    p.add_argument(
        "--nodes",
        type=int,
        metavar="N",
        help="--engine sim: N simulated daemons in this process, on --port and the ports "
        "after it, named DAEMON_NAME-I (default 1)",
    )
    p.add_argument(
        "--first-node",
        type=int,
        metavar="I",
        help="with --nodes: the first daemon's number I (default 1)",
    )
    p.add_argument(
        "--node-control",
        choices=["stdin"],
        help="with --nodes: read `kill I`, `stop I` (drain) and `start I` a line on stdin, "
        "to lose and restart single nodes (warmfleet sim run's node events)",
    )
    p.add_argument("--host")
    p.add_argument("--port", type=int)
    p.add_argument("--cache-memory-mb", type=int, help="prefix-cache budget; 0 disables it")
    p.add_argument("--block-size", type=int, help="prefill chunk / cache block, in tokens")
    p.add_argument(
        "--kv-bits",
        type=int,
        choices=[8, 4],
        help="quantized KV cache (mlx-lm's): more cached tokens per GB in RAM and on disk; "
        "decoding sequences then attend one at a time",
    )
    p.add_argument("--max-num-seqs", type=int, help="sequences prefilling or decoding at once")
    p.add_argument(
        "--prefill-aging-picks",
        type=int,
        metavar="N",
        help="prefill order: shortest remaining first, a prompt counting one block shorter per "
        "N chunks it waited (default 16; 0: no aging, long prompts can starve under load)",
    )
    p.add_argument(
        "--max-context",
        type=int,
        metavar="N",
        help="context length to serve, beyond the model's configured one if need be (a "
        "warning is logged; e.g. the embedded model's 8192 tokens are less than Claude "
        "Code's first request)",
    )
    p.add_argument(
        "--no-next-turn-prefill",
        dest="next_turn_prefill",
        action="store_const",
        const=False,
        help="do not prefill a conversation's next prefix (its answer and the next "
        "message's header) at idle priority after each response",
    )
    p.add_argument("--default-max-tokens", type=int)
    p.add_argument(
        "--max-output-tokens",
        type=int,
        metavar="N",
        help="the longest response in tokens, whatever a request asks or leaves open (Codex "
        "sets no limit): longer ones end as cut by their own limit",
    )
    p.add_argument("--default-temperature", type=float)
    p.add_argument(
        "--access-log",
        action="store_const",
        const=True,
        help="log every request, the polls of health, status, cache snapshots, events and "
        "warm sets too (left out by default: they come every few seconds)",
    )
    p.add_argument(
        "--warm-prompts",
        metavar="FILE",
        help="prompts to warm at start: vllm-mlx's JSON list of message lists, or a "
        "JSON/YAML list of {name, messages, tools}",
    )
    p.add_argument("--warm-prompts-concurrency", type=int, metavar="N")
    p.add_argument(
        "--state-dir",
        help="keep pushed warm sets and KV snapshots of their blocks here; a restart reloads "
        "them instead of prefilling",
    )
    p.add_argument(
        "--snapshot-disk-mb",
        type=int,
        metavar="MB",
        help="disk budget of the KV snapshots in --state-dir (default 4096; 0: no snapshots)",
    )
    p.add_argument(
        "--cache-dir",
        metavar="DIR",
        help="the disk tier: every cache block is also written here (write-behind) and read "
        "back instead of prefilled, also after a restart (default: kv-cache in --state-dir)",
    )
    p.add_argument(
        "--cache-disk-mb",
        type=int,
        metavar="MB",
        help="disk budget of the disk tier, least recently used out (default 16384; 0: none)",
    )
    p.add_argument(
        "--warm-from",
        action="append",
        metavar="URL",
        help="a warm peer daemon (same model and flags): copy its blocks before prefilling a "
        "warm prompt; repeatable (its admin token: this daemon's own)",
    )
    p.add_argument(
        "--warm-from-deadline",
        type=float,
        metavar="S",
        dest="warm_from_deadline_s",
        help="time to copy one warm prompt's blocks from peers (--warm-from or pushed); "
        "then the rest is prefilled (default 120)",
    )
    p.add_argument(
        "--spill",
        choices=["auto", "always", "off"],
        help="a request the router sent here naming the daemon that holds its blocks: copy "
        "them from it when estimated faster than prefill (auto, the default), always, or never",
    )
    p.add_argument(
        "--spill-deadline",
        type=float,
        metavar="S",
        dest="spill_deadline_s",
        help="the longest one spill copy may take, then the rest is prefilled (default 30)",
    )
    p.add_argument(
        "--drain-seconds",
        type=float,
        metavar="S",
        help="on SIGTERM, answer /readyz 'draining' and keep serving this long so the router "
        "moves this daemon's sessions to others (default 10; 0: stop at once)",
    )
    p.add_argument(
        "--max-state-mb", type=int, metavar="N", help="bound on the state file (default 64)"
    )
    p.add_argument(
        "--admin-token-file",
        metavar="FILE",
        help="bearer token for the admin routes (or WARMFLEET_ADMIN_TOKEN)",
    )
    p.add_argument(
        "--api-keys-file",
        metavar="FILE",
        help="client API keys, one `TENANT KEY` a line (KEY as it is, or sha256:HEX): every "
        "inference route then needs one (Authorization: Bearer, or x-api-key on Anthropic's "
        "routes); each tenant's cache blocks are its own; read again when the file changes",
    )
    p.add_argument(
        "--tls-cert",
        metavar="FILE",
        help="serve HTTPS with this certificate (cert-manager's tls.crt; read again when it "
        "changes); also presented to peers that ask for a client certificate",
    )
    p.add_argument("--tls-key", metavar="FILE", help="its key (tls.key)")
    p.add_argument(
        "--tls-ca",
        metavar="FILE",
        help="verify peers' certificates with this CA bundle (ca.crt; default: the system's)",
    )
    p.add_argument(
        "--tls-client-ca",
        metavar="FILE",
        help="require a client certificate signed by this CA on the admin, warm-set and peer "
        "routes (mTLS), besides their token or grant",
    )
    p.add_argument(
        "--tls-client-cert",
        metavar="FILE",
        help="the certificate presented to peers that ask for one (default: --tls-cert)",
    )
    p.add_argument("--tls-client-key", metavar="FILE", help="its key (default: --tls-key)")
    p.add_argument(
        "--public-url",
        action="append",
        metavar="URL",
        help="a URL peers reach this daemon at through a proxy that rewrites Host or adds a "
        "path prefix: peer grants issued for it are honoured; repeatable (--register's "
        "--advertise-url is one already)",
    )
    p.add_argument("--daemon-name", help="this daemon's name on its metrics (default: host name)")
    p.add_argument(
        "--otlp-endpoint",
        metavar="URL",
        help="also push metrics by OTLP (or set OTEL_EXPORTER_OTLP_ENDPOINT; "
        "OTEL_EXPORTER_OTLP_PROTOCOL picks grpc or http/protobuf)",
    )
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])


def settings_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The DaemonSettings fields the flags set (the rest come from WARMFLEET_* or defaults)."""
    from warmfleet_daemon.settings import DaemonSettings

    overrides = {
        k: v
        for k, v in vars(args).items()
        if v is not None and k in DaemonSettings.model_fields and k != "log_level"
    }
    token = args.admin_token_file or os.environ.get("WARMFLEET_ADMIN_TOKEN", "").strip()
    many = getattr(args, "nodes", None) is not None  # each names itself: fleet_process
    if many and getattr(args, "register", None) and "daemon_name" not in overrides:
        overrides["daemon_name"] = args.register  # PREFIX-I: daemon and WarmNode alike
    advertised = getattr(args, "register", None) and getattr(args, "advertise_url", None)
    if advertised and token and not many:
        # the operator names this daemon by its WarmNode's URL in the grants it issues
        overrides["public_url"] = [*overrides.get("public_url", []), args.advertise_url]
    return overrides


def serve(args: argparse.Namespace) -> int:
    setup_logging(args.log_level)
    ensure_fast_blas()  # before anything imports mlx
    import uvicorn
    from pydantic import ValidationError

    from warmfleet_common.bounded import SERVER_KEEP_ALIVE_S
    from warmfleet_common.client_keys import KeysFile
    from warmfleet_common.tls import install_https
    from warmfleet_daemon.api.app import create_app
    from warmfleet_daemon.kvtransfer.snapshots import check_directory as check_snapshot_directory
    from warmfleet_daemon.models.loader import on_gpu
    from warmfleet_daemon.node.cli import register_if_asked
    from warmfleet_daemon.runtime.drain import DrainingServer
    from warmfleet_daemon.settings import DaemonSettings
    from warmfleet_daemon.support import open_files
    from warmfleet_daemon.warming.sets import read_warm_prompts_file
    from warmfleet_daemon.warming.state_store import StateStore

    overrides = settings_overrides(args)
    try:
        if args.admin_token_file:
            with open(args.admin_token_file) as f:
                overrides["admin_token"] = f.read().strip()
            if not overrides["admin_token"]:
                raise ValueError(
                    f"--admin-token-file {args.admin_token_file} is empty: the admin routes "
                    "would be open. Put the token in it, or leave the flag out."
                )
        elif os.environ.get("WARMFLEET_ADMIN_TOKEN", "x").strip() == "":
            raise ValueError("WARMFLEET_ADMIN_TOKEN is empty: the admin routes would be open")
        settings = DaemonSettings(**overrides, log_level=args.log_level)
        tls_problem = settings.tls().problem()
        if tls_problem:
            raise ValueError(tls_problem)
        if settings.api_keys_file:
            KeysFile(settings.api_keys_file)  # a bad file stops `serve` now, naming the line
        if settings.warm_prompts:
            read_warm_prompts_file(settings.warm_prompts)  # fail now, not after loading
        if settings.state_dir:  # fail now, not as a daemon that never gets ready
            StateStore(settings.state_dir).check_writable()
            if settings.snapshot_disk_mb > 0:
                check_snapshot_directory(settings.state_dir)
    except (ValidationError, ValueError, OSError) as exc:
        print(f"warmfleet serve: {exc}", file=sys.stderr)
        return 2
    say_if_open(settings)
    if not settings.tls_cert and not settings.binds_loopback():
        log.warning(
            "serving plain HTTP on %s: prompts, keys and the admin token cross the network in "
            "clear (--tls-cert and --tls-key serve HTTPS)",
            settings.host,
        )
    if not settings.admin_token and not settings.binds_loopback():
        print(
            f"warmfleet serve: refusing to listen on {settings.host} without an admin token: "
            "the warm-set and cache routes would be open to the network. Pass "
            "--admin-token-file FILE or set WARMFLEET_ADMIN_TOKEN.",
            file=sys.stderr,
        )
        return 2
    nodes, first = args.nodes or 1, args.first_node or 1
    if (args.nodes is not None or args.first_node is not None) and settings.engine != "sim":
        print("warmfleet serve: --nodes and --first-node only with --engine sim", file=sys.stderr)
        return 2
    if getattr(args, "node_control", None) is not None and args.nodes is None:
        print("warmfleet serve: --node-control only with --nodes", file=sys.stderr)
        return 2
    if nodes < 1 or first < 1 or (nodes > 1 and settings.port == 0):
        print("warmfleet serve: --nodes N >= 1, --first-node I >= 1, a --port", file=sys.stderr)
        return 2
    # Bound before the model starts loading: uvicorn binds after startup, and its exit on a
    # taken port, with the loading thread inside MLX, aborted the process (exit 134).
    listeners: list[socket.socket] = []
    for port in range(settings.port, settings.port + nodes):
        try:
            listeners.append(
                socket.create_server(
                    (settings.host, port),
                    family=socket.AF_INET6 if ":" in settings.host else socket.AF_INET,
                )
            )
        except OSError as exc:
            print(
                f"warmfleet serve: cannot listen on {settings.host}:{port}: {exc}", file=sys.stderr
            )
            for taken in listeners:
                taken.close()
            return 3
    if args.nodes is not None:
        control = getattr(args, "node_control", None) == "stdin"
        return _serve_simulated_nodes(args, settings, nodes, first, listeners, control)
    listener = listeners[0]
    failure = register_if_asked(args, settings)  # --register NAME: this node's WarmNode
    if failure:
        print(f"warmfleet serve: {failure}", file=sys.stderr)
        listener.close()
        return 2
    log_blas(ensure_fast_blas(), on_gpu=on_gpu())
    port = listener.getsockname()[1]  # --port 0: the one the system chose
    base = f"{'https' if settings.tls_cert else 'http'}://{settings.host}:{port}"
    log.info(
        "warmfleet daemon on %s; loading model %r in the background (GET %s/readyz)",
        base,
        settings.model,
        base,
    )
    log.info(
        "Talk to it: curl %s/v1/chat/completions -H 'Content-Type: application/json' "
        '-d \'{"model": "default", "temperature": 0, '
        '"messages": [{"role": "user", "content": "Hello!"}]}\''
        "  (or any OpenAI client with base_url=%s/v1)",
        base,
        base,
    )
    # The engine thread gives up the GIL in every mx.eval and needs it back at once; at
    # Python's default 5 ms the event loop and other threads kept it waiting (c=8 decode
    # over HTTP: 91-98 tok/s at 5 ms, 113-117 at 0.2 ms, docs/PERFORMANCE.md).
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    app = create_app(settings)
    open_files.restore()  # mlx-lm's import lowered it
    app.state.daemon.on_ready.append(freeze_heap)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        timeout_graceful_shutdown=5,
        timeout_keep_alive=SERVER_KEEP_ALIVE_S,
    )
    if settings.tls_cert:
        install_https(config, settings.tls())
    quiet_access_log(show_polls=settings.access_log)  # after uvicorn configured logging
    server = DrainingServer(config, app.state.daemon, settings.drain_seconds)
    with contextlib.suppress(KeyboardInterrupt):  # uvicorn re-raises the SIGINT it caught
        server.run(sockets=[listener])
    return 0 if server.started else 3  # uvicorn's exit code when it could not start


def say_if_open(settings: DaemonSettings) -> None:
    """Once at start: without a keys file, anyone who reaches the daemon may use it (a
    warning beyond loopback)."""
    if not settings.api_keys_file:
        log.log(
            logging.INFO if settings.binds_loopback() else logging.WARNING,
            "no --api-keys-file: the inference routes of %s:%s are open to anyone who can "
            "reach them, and every client shares one prefix cache",
            settings.host,
            settings.port,
        )


def _serve_simulated_nodes(
    args: argparse.Namespace,
    settings: DaemonSettings,
    nodes: int,
    first: int,
    listeners: list[socket.socket],
    control: bool,
) -> int:
    from warmfleet_daemon.fleet_process import member_settings, serve_many
    from warmfleet_daemon.node.cli import register_members_if_asked

    members = member_settings(settings, nodes, first, settings.port)
    failure = register_members_if_asked(args, members)  # --register PREFIX: PREFIX-I each
    if failure:
        print(f"warmfleet serve: {failure}", file=sys.stderr)
        for listener in listeners:
            listener.close()
        return 2
    log.info(
        "%d simulated daemons (profile %s, %gx) on http://%s:%d-%d, named %s to %s",
        nodes,
        settings.profile,
        settings.sim_speed,
        settings.host,
        settings.port,
        settings.port + nodes - 1,
        members[0].daemon_name,
        members[-1].daemon_name,
    )
    # Python's default GIL switch interval (5 ms), not a real engine's 0.2 ms: no mx.eval
    # waits for the GIL here, and a 50-node process's ~270 threads spent its CPU in futex
    # waits while a full collection held the GIL (those took 27-53 s before the heap froze).
    return 0 if serve_many(members, listeners, first, control) else 3


def convert(args: argparse.Namespace) -> int:
    setup_logging("info")
    ensure_fast_blas()  # before anything imports mlx
    from warmfleet_daemon.models.convert import convert as convert_model

    path = convert_model(args.model, args.output, dtype=args.dtype)
    print(f"wrote {path}: serve it with `warmfleet serve --model {path}` or mlx_lm.server")
    return 0
