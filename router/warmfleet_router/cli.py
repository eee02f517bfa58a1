"""`warmfleet router`: the OpenAI-compatible gateway in front of the daemons."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import ssl
from pathlib import Path

from warmfleet_router.policy import DEFAULT_EPSILON, POLICIES


def add_arguments(p: argparse.ArgumentParser) -> None:
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--backend",
        action="append",
        metavar="URL",
        help="a daemon (or any OpenAI server); repeatable",
    )
    source.add_argument(
        "--from-cluster", action="store_true", help="every WarmNode in the cluster (watched)"
    )
    source.add_argument(
        "--local", metavar="DIR", help="the WarmNodes in DIR (the folder `operator --local` reads)"
    )
    p.add_argument(
        "--admin-token-file",
        help="the daemons' admin token (for their cache events, status and warm sets), also "
        "asked of callers of /v1/router/status's detail; also WARMFLEET_ADMIN_TOKEN. "
        "WarmNodes naming a Secret use theirs",
    )
    p.add_argument(
        "--api-keys-file",
        metavar="FILE",
        help="client API keys, one `TENANT KEY` a line (KEY as it is, or sha256:HEX): every "
        "inference route then needs one (Authorization: Bearer, or x-api-key on Anthropic's "
        "routes), and each tenant's cache blocks, sessions and quotas are its own; read "
        "again when the file changes",
    )
    p.add_argument(
        "--quotas",
        metavar="FILE",
        help="limits per tenant (YAML: `default:` and `tenants: {NAME: ...}`, each with "
        "requests_per_minute, prompt_tokens_per_minute, generated_tokens_per_minute, "
        "concurrent_requests): over one, a 429 with Retry-After; read again when it changes",
    )
    p.add_argument(
        "--tenant-share-window",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="with client keys: a tenant with at least its share of the fleet in flight "
        "(backends per active tenant) goes to the backends the fewest other tenants used "
        "within SECONDS, so its burst stays off theirs; 0: off (default 60)",
    )
    p.add_argument(
        "--tls-cert",
        metavar="FILE",
        help="serve HTTPS with this certificate (cert-manager's tls.crt; read again when it "
        "changes); also presented to daemons that ask for a client certificate",
    )
    p.add_argument("--tls-key", metavar="FILE", help="its key (tls.key)")
    p.add_argument(
        "--tls-ca",
        metavar="FILE",
        help="verify the daemons' certificates with this CA bundle (ca.crt; default: the "
        "system's CAs, for https backends)",
    )
    p.add_argument(
        "--tls-client-ca",
        metavar="FILE",
        help="require a client certificate signed by this CA for the status's detail (mTLS)",
    )
    p.add_argument(
        "--tls-client-cert",
        metavar="FILE",
        help="the certificate presented to daemons that ask for one (default: --tls-cert)",
    )
    p.add_argument("--tls-client-key", metavar="FILE", help="its key (default: --tls-key)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--policy", choices=POLICIES, default="prefix")
    p.add_argument(
        "--epsilon",
        type=float,
        default=DEFAULT_EPSILON,
        help="bounded load: no backend above (1 + epsilon) x the mean in-flight",
    )
    p.add_argument(
        "--session-key",
        action="append",
        metavar="SOURCE",
        help="where a request's session key is, first found wins: header:NAME or "
        "body:FIELD[.FIELD...]; repeatable (default: header:x-session-affinity, "
        "header:x-prefix-hash, header:x-claude-code-session-id, body:prompt_cache_key, "
        "body:metadata.user_id)",
    )
    p.add_argument(
        "--key-workers",
        type=int,
        default=2,
        help="processes that parse, check and tokenize request bodies over 256 KiB (off the "
        "router's GIL); smaller ones are prepared on threads of the router, never on its "
        "event loop; 0: threads for all",
    )
    p.add_argument(
        "--request-timeout",
        type=float,
        default=900.0,
        help="seconds from a request's arrival to its response's last byte, streamed or not",
    )
    p.add_argument("--index-mb", type=int, default=64, help="byte budget of the block index (MiB)")
    p.add_argument(
        "--sessions-mb", type=int, default=16, help="byte budget of the session table (MiB)"
    )
    p.add_argument(
        "--health-interval", type=float, default=2.0, help="seconds between /readyz probes"
    )
    p.add_argument(
        "--handoff-sessions",
        type=int,
        default=16,
        help="when a backend drains (SIGTERM, or its WarmNode deleted): how many of its most "
        "recent sessions the backends they move to copy from it (0: none)",
    )
    p.add_argument(
        "--handoff-seconds",
        type=float,
        default=20.0,
        help="the time a drain's whole handoff may take; then the rest prefill when they return",
    )
    p.add_argument(
        "--namespace",
        default=os.environ.get("WARMFLEET_NAMESPACE", "default"),
        help="--from-cluster: where Secrets without a namespace are",
    )
    p.add_argument(
        "--learn-min-sessions",
        type=int,
        default=3,
        metavar="K",
        help="learn a warm prompt from a static head (system prompt, tools, messages before "
        "the first user message) once K distinct sessions of a tenant sent it; listed at "
        "GET /v1/router/learned (admin token), for the operator's learning WarmPromptSets; "
        "nothing after the first user message is kept; 0: off",
    )
    p.add_argument(
        "--learn-ttl",
        default="7d",
        metavar="DURATION",
        help="the window the sessions are counted in, and how long a learned warm prompt no "
        "request used is kept (90s, 15m, 12h, 7d)",
    )
    p.add_argument("--log-level", default="info")
    p.add_argument(
        "--access-log",
        action="store_true",
        help="log every request it answers, health and status polls included",
    )


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from warmfleet_common.bounded import SERVER_KEEP_ALIVE_S
    from warmfleet_common.client_keys import KeysFile, KeysFileError
    from warmfleet_common.tls import (
        TlsOptions,
        client_verify,
        install_https,
        listens_beyond_loopback,
    )
    from warmfleet_common.watched import WatchedFile
    from warmfleet_router.app import create_app
    from warmfleet_router.discovery import ClusterSource, FolderSource, Source, StaticSource
    from warmfleet_router.options import ProxyOptions, RouterOptions
    from warmfleet_router.quotas import parse_quotas
    from warmfleet_router.sessions import DEFAULT_SOURCES, SessionKeys
    from warmfleet_router.sync import SyncOptions

    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)
    if args.epsilon < 0:
        print("warmfleet router: --epsilon must be >= 0")
        return 2
    for name in ("key_workers", "index_mb", "sessions_mb"):
        if getattr(args, name) < 0:
            print(f"warmfleet router: --{name.replace('_', '-')} must be >= 0")
            return 2
    if args.handoff_sessions < 0 or args.handoff_seconds <= 0:
        print("warmfleet router: --handoff-sessions must be >= 0 and --handoff-seconds > 0")
        return 2
    if args.tenant_share_window < 0:
        print("warmfleet router: --tenant-share-window must be >= 0")
        return 2
    if args.request_timeout <= 0:
        print("warmfleet router: --request-timeout must be > 0")
        return 2
    from warmfleet_common.durations import parse_duration
    from warmfleet_router.learning import LearnOptions

    try:
        learn_ttl = parse_duration(args.learn_ttl)
    except ValueError as exc:
        print(f"warmfleet router: --learn-ttl: {exc}")
        return 2
    if args.learn_min_sessions < 0 or learn_ttl <= 0:
        print("warmfleet router: --learn-min-sessions must be >= 0 and --learn-ttl > 0")
        return 2
    session_keys = tuple(args.session_key or DEFAULT_SOURCES)
    try:
        SessionKeys(session_keys)
    except ValueError as exc:
        print(f"warmfleet router: --session-key: {exc}")
        return 2
    token = os.environ.get("WARMFLEET_ADMIN_TOKEN") or None
    if args.admin_token_file:
        try:
            token = Path(args.admin_token_file).read_text().strip()
        except (OSError, UnicodeDecodeError) as exc:
            print(f"warmfleet router: --admin-token-file: {exc}")
            return 2
        if not token:  # as `warmfleet serve` refuses it: an empty token protects nothing
            print(f"warmfleet router: --admin-token-file {args.admin_token_file} is empty")
            return 2
    if args.api_keys_file:
        try:
            KeysFile(args.api_keys_file)
        except (OSError, UnicodeDecodeError, KeysFileError) as exc:
            print(f"warmfleet router: --api-keys-file: {exc}")
            return 2
    tls = TlsOptions(
        args.tls_cert,
        args.tls_key,
        args.tls_ca,
        args.tls_client_ca,
        args.tls_client_cert,
        args.tls_client_key,
    )
    problem = tls.problem()
    if problem:
        print(f"warmfleet router: {problem}")
        return 2
    if not tls.serves and listens_beyond_loopback(args.host):
        logging.getLogger("warmfleet_router").warning(
            "serving plain HTTP on %s: prompts and keys cross the network in clear "
            "(--tls-cert and --tls-key serve HTTPS)",
            args.host,
        )
    if args.quotas:
        try:
            WatchedFile(args.quotas, parse_quotas, "quotas")
        except (OSError, ValueError) as exc:
            print(f"warmfleet router: --quotas {args.quotas}: {exc}")
            return 2
    if not args.api_keys_file:
        loopback = args.host in ("localhost", "::1") or args.host.startswith("127.")
        logging.getLogger("warmfleet_router").log(
            logging.INFO if loopback else logging.WARNING,
            "no --api-keys-file: the inference routes of %s:%d are open to anyone who can "
            "reach them, and every client shares one prefix cache",
            args.host,
            args.port,
        )
    try:
        source: Source
        if args.backend:
            source = StaticSource(args.backend, token)
        elif args.local:
            source = FolderSource(Path(args.local), token=token)
        else:
            source = ClusterSource(namespace=args.namespace, token=token)
    except ValueError as exc:
        print(f"warmfleet router: {exc}")
        return 2
    options = RouterOptions(
        policy=args.policy,
        epsilon=args.epsilon,
        sync=SyncOptions(health_interval=args.health_interval),
        session_keys=session_keys,
        proxy=ProxyOptions(request_timeout=args.request_timeout),
        index_budget_bytes=args.index_mb << 20,
        sessions_budget_bytes=args.sessions_mb << 20,
        key_workers=args.key_workers,
        admin_token=token,
        api_keys_file=args.api_keys_file,
        quotas_file=args.quotas,
        tenant_share_window_s=args.tenant_share_window,
        tls=tls,
        handoff_sessions=args.handoff_sessions,
        handoff_seconds=args.handoff_seconds,
        freeze_gc_heap=True,
        learn=LearnOptions(min_sessions=args.learn_min_sessions, ttl=learn_ttl),
    )
    verify = client_verify(tls)  # its client certificate reloaded as it rotates
    tls_client = verify if isinstance(verify, ssl.SSLContext) else None
    app = create_app(source, options, tls_client)
    logging.getLogger("warmfleet_router").info(
        "listening on %s://%s:%d (policy %s)",
        "https" if tls.serves else "http",
        args.host,
        args.port,
        args.policy,
    )
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level.lower(),
        access_log=args.access_log,
        # Idle keep-alive connections over TLS wait for their client's close_notify (30 s
        # in asyncio) before they count as closed: a stop does not wait for them that long.
        timeout_graceful_shutdown=5,
        # uvloop and httptools: a third of the router's CPU per request was asyncio's loop
        # and h11's parser (bench/router_overhead.py).
        loop="uvloop" if _importable("uvloop") else "asyncio",
        http="httptools" if _importable("httptools") else "h11",
        timeout_keep_alive=SERVER_KEEP_ALIVE_S,
    )
    if tls.serves:
        install_https(config, tls)
    server = uvicorn.Server(config)
    with contextlib.suppress(KeyboardInterrupt):  # uvicorn re-raises the SIGINT it caught
        server.run()
    return 0 if server.started else 3  # as uvicorn.run: 3 when it could not start


def _importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None
