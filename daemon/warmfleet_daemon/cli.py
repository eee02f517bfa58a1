"""`warmfleet`: the daemon (`serve`), model conversion (`convert`)."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from warmfleet_daemon.blas import ensure_fast_blas, log_blas

log = logging.getLogger("warmfleet")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="warmfleet", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    _serve_parser(sub.add_parser("serve", help="run the daemon (OpenAI API + prefix cache)"))
    convert = sub.add_parser(
        "convert", help="write a model (e.g. `default`) as an mlx-lm directory"
    )
    convert.add_argument("model", help="default | FILE.gguf | mlx-lm dir | HF id")
    convert.add_argument("output", help="directory to write")
    convert.add_argument("--dtype", choices=["float32", "float16", "bfloat16"], default="float32")
    from warmfleet_operator.cli import add_arguments, run

    add_arguments(
        sub.add_parser("operator", help="the Kubernetes operator (or --local DIR without one)")
    )
    args = parser.parse_args(argv)
    if args.command == "operator":
        return run(args)
    _setup_logging(getattr(args, "log_level", "info"))
    ensure_fast_blas()  # before anything imports mlx
    if args.command == "serve":
        return _serve(args)
    return _convert(args)


def _serve_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="default | FILE.gguf | mlx-lm dir | HF id | tiny-random")
    p.add_argument("--served-model-name")
    p.add_argument("--host")
    p.add_argument("--port", type=int)
    p.add_argument("--cache-memory-mb", type=int, help="prefix-cache budget; 0 disables it")
    p.add_argument("--block-size", type=int, help="prefill chunk / cache block, in tokens")
    p.add_argument("--max-num-seqs", type=int, help="sequences prefilling or decoding at once")
    p.add_argument("--default-max-tokens", type=int)
    p.add_argument("--default-temperature", type=float)
    p.add_argument(
        "--warm-prompts",
        metavar="FILE",
        help="prompts to warm at start: vllm-mlx's JSON list of message lists, or a "
        "JSON/YAML list of {name, messages, tools}",
    )
    p.add_argument("--warm-prompts-concurrency", type=int, metavar="N")
    p.add_argument("--state-dir", help="keep pushed warm sets here; re-warm them after a restart")
    p.add_argument(
        "--admin-token-file",
        metavar="FILE",
        help="bearer token for the admin routes (or WARMFLEET_ADMIN_TOKEN)",
    )
    p.add_argument("--daemon-name", help="this daemon's name on its metrics (default: host name)")
    p.add_argument(
        "--otlp-endpoint",
        metavar="URL",
        help="also push metrics by OTLP (or set OTEL_EXPORTER_OTLP_ENDPOINT; "
        "OTEL_EXPORTER_OTLP_PROTOCOL picks grpc or http/protobuf)",
    )
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])


def _serve(args: argparse.Namespace) -> int:
    import uvicorn
    from pydantic import ValidationError

    from warmfleet_daemon.api.app import create_app
    from warmfleet_daemon.models.loader import on_gpu
    from warmfleet_daemon.settings import DaemonSettings
    from warmfleet_daemon.warming import read_warm_prompts_file

    overrides = {
        k: v
        for k, v in vars(args).items()
        if v is not None and k in DaemonSettings.model_fields and k != "log_level"
    }
    try:
        if args.admin_token_file:
            with open(args.admin_token_file) as f:
                overrides["admin_token"] = f.read().strip()
        settings = DaemonSettings(**overrides, log_level=args.log_level)
        if settings.warm_prompts:
            read_warm_prompts_file(settings.warm_prompts)  # fail now, not after loading
    except (ValidationError, ValueError, OSError) as exc:
        print(f"warmfleet serve: {exc}", file=sys.stderr)
        return 2
    if not settings.admin_token and not settings.binds_loopback():
        print(
            f"warmfleet serve: refusing to listen on {settings.host} without an admin token: "
            "the warm-set and cache routes would be open to the network. Pass "
            "--admin-token-file FILE or set WARMFLEET_ADMIN_TOKEN.",
            file=sys.stderr,
        )
        return 2
    log_blas(ensure_fast_blas(), on_gpu=on_gpu())
    base = f"http://{settings.host}:{settings.port}"
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
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        timeout_graceful_shutdown=5,
    )
    return 0


def _convert(args: argparse.Namespace) -> int:
    from warmfleet_daemon.models.convert import convert

    path = convert(args.model, args.output, dtype=args.dtype)
    print(f"wrote {path}: serve it with `warmfleet serve --model {path}` or mlx_lm.server")
    return 0


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


if __name__ == "__main__":
    sys.exit(main())
