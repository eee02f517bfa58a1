"""`warmfleet`: the daemon (`serve`), model conversion (`convert`), benchmarks against any
OpenAI-compatible server (`bench-serve`, `bench-compare`) and the prefix audit of a
request log (`audit`)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence

from warmfleet_daemon.blas import ensure_fast_blas, log_blas

log = logging.getLogger("warmfleet")

GIL_SWITCH_INTERVAL_S = 0.0002  # see _serve


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="warmfleet", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    _serve_parser(sub.add_parser("serve", help="run the daemon (OpenAI API + prefix cache)"))
    add_fleet_parsers(sub)
    convert = sub.add_parser(
        "convert", help="write a model (e.g. `default`) as an mlx-lm directory"
    )
    convert.add_argument("model", help="default | FILE.gguf | mlx-lm dir | HF id")
    convert.add_argument("output", help="directory to write")
    convert.add_argument("--dtype", choices=["float32", "float16", "bfloat16"], default="float32")
    _bench_serve_parser(
        sub.add_parser(
            "bench-serve",
            help="measure TTFT, throughput and cached tokens of an OpenAI-compatible server",
            description="Stream chat requests at a server (a warmfleet daemon, mlx_lm.server, "
            "vLLM, ...) per prompt set and concurrency; report TTFT, TPOT, latency, cached "
            "tokens, throughput and the server's hit counters. Run it once against a cold "
            "server (--tag cold) and once against a warm one (--tag warm), then bench-compare.",
        )
    )
    _bench_compare_parser(
        sub.add_parser(
            "bench-compare",
            help="compare two bench-serve runs (cold vs warm): a table and a PNG plot",
        )
    )
    _audit_parser(
        sub.add_parser(
            "audit",
            help="find what breaks the prefix-cache hit rate in a log of requests",
            description="Render and tokenize each request of LOG with the model's template "
            "and tokenizer, then report how many prefixes are unique, the hit rate an "
            "unbounded cache would get (token by token and in blocks), the hit rate if every "
            "prefix matched, where prompts diverge and what varies there (dates, IDs, "
            "versions, reordered blocks), with advice.",
        )
    )
    from warmfleet_operator.cli import add_arguments, run

    add_arguments(
        sub.add_parser("operator", help="the Kubernetes operator (or --local DIR without one)")
    )
    from warmfleet_router.cli import add_arguments as add_router_arguments
    from warmfleet_router.cli import run as run_router

    add_router_arguments(
        sub.add_parser(
            "router",
            help="the OpenAI-compatible gateway: each request to the daemon holding its prefix",
        )
    )
    from warmfleet_router import up

    up.add_arguments(
        sub.add_parser(
            "up",
            help="the fleet on one machine: N daemons, the operator (local mode), the router",
        )
    )
    args = parser.parse_args(argv)
    if args.command == "operator":
        return run(args)
    if args.command == "service":
        return run_fleet_service(args)
    if args.command == "router":  # an HTTP gateway: no mlx, no BLAS
        return run_router(args)
    if args.command == "up":  # starts the others as processes
        return up.run(args)
    _setup_logging(getattr(args, "log_level", "info"))
    if args.command == "bench-serve":  # HTTP clients: no mlx, no BLAS
        return _bench_serve(args)
    if args.command == "bench-compare":
        return _bench_compare(args)
    ensure_fast_blas()  # before anything imports mlx
    if args.command == "audit":
        return _audit(args)
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
    p.add_argument(
        "--prefill-aging-picks",
        type=int,
        metavar="N",
        help="prefill order: shortest remaining first, a prompt counting one block shorter per "
        "N chunks it waited (default 16; 0: no aging, long prompts can starve under load)",
    )
    p.add_argument("--default-max-tokens", type=int)
    p.add_argument("--default-temperature", type=float)
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
        "--warm-from",
        action="append",
        metavar="URL",
        help="a warm peer daemon (same model and flags): copy its blocks before prefilling a "
        "warm prompt; repeatable (its admin token: this daemon's own)",
    )
    p.add_argument(
        "--max-state-mb", type=int, metavar="N", help="bound on the state file (default 64)"
    )
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
    from warmfleet_daemon.cli_fleet import register_if_asked
    from warmfleet_daemon.models.loader import on_gpu
    from warmfleet_daemon.settings import DaemonSettings
    from warmfleet_daemon.state_store import StateStore
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
            if not overrides["admin_token"]:
                raise ValueError(
                    f"--admin-token-file {args.admin_token_file} is empty: the admin routes "
                    "would be open. Put the token in it, or leave the flag out."
                )
        elif os.environ.get("WARMFLEET_ADMIN_TOKEN", "x").strip() == "":
            raise ValueError("WARMFLEET_ADMIN_TOKEN is empty: the admin routes would be open")
        settings = DaemonSettings(**overrides, log_level=args.log_level)
        if settings.warm_prompts:
            read_warm_prompts_file(settings.warm_prompts)  # fail now, not after loading
        if settings.state_dir:  # fail now, not as a daemon that never gets ready
            StateStore(settings.state_dir).check_writable()
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
    failure = register_if_asked(args, settings)  # --register NAME: this node's WarmNode
    if failure:
        print(f"warmfleet serve: {failure}", file=sys.stderr)
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
    # The engine thread gives up the GIL in every mx.eval and needs it back at once; at
    # Python's default 5 ms the event loop and other threads kept it waiting (c=8 decode
    # over HTTP: 91-98 tok/s at 5 ms, 113-117 at 0.2 ms, docs/PERFORMANCE.md).
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        timeout_graceful_shutdown=5,
    )
    return 0


def _serve_and_register_arguments(p: argparse.ArgumentParser) -> None:
    from warmfleet_daemon.cli_fleet import add_register_arguments

    _serve_parser(p)
    add_register_arguments(p)


def add_fleet_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`serve --register ...` and `service install/uninstall` (warmfleet_daemon.cli_fleet)."""
    from warmfleet_daemon.cli_fleet import add_register_arguments, add_service_parser

    add_register_arguments(sub.choices["serve"])
    add_service_parser(sub, _serve_and_register_arguments)


def run_fleet_service(args: argparse.Namespace) -> int:
    from warmfleet_daemon.cli_fleet import run_service

    return run_service(args, _serve_and_register_arguments)


def _convert(args: argparse.Namespace) -> int:
    from warmfleet_daemon.models.convert import convert

    path = convert(args.model, args.output, dtype=args.dtype)
    print(f"wrote {path}: serve it with `warmfleet serve --model {path}` or mlx_lm.server")
    return 0


def _bench_serve_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", help="the server, e.g. http://127.0.0.1:8000 (with or without /v1)")
    p.add_argument("--model", help="model id to request (default: the one /v1/models lists)")
    p.add_argument(
        "--prompts",
        default="short",
        metavar="SET[,SET..]",
        help="built-in sets short, medium, long (agent messages after a built-in ~860-token "
        "agent system prompt) or FILEs (JSON/JSONL of messages); default: short",
    )
    p.add_argument(
        "--concurrency",
        default="1,4,8",
        metavar="N[,N..]",
        help="requests in flight at once, one cell per value (default: 1,4,8)",
    )
    p.add_argument(
        "--system-prompt-file",
        metavar="F",
        help="use this system prompt in every request (replacing the prompts' own)",
    )
    p.add_argument("--max-tokens", type=int, default=64, help="per request (default: 64)")
    p.add_argument(
        "--requests",
        type=int,
        metavar="N",
        help="requests per cell (default: the concurrency: one simultaneous burst)",
    )
    p.add_argument("--repetitions", type=int, default=1, metavar="N", help="runs of each cell")
    p.add_argument("--tag", default="", help="label of this run in the output (cold, warm, ...)")
    p.add_argument(
        "--output", metavar="F", help="write the rows to F (CSV, or JSON if F ends in .json)"
    )
    p.add_argument(
        "--format",
        choices=["table", "csv", "json"],
        help="table (default), or csv/json rows: to --output, else to stdout",
    )
    p.add_argument(
        "--cache-policy",
        choices=["preserve", "clear-before-run"],
        default="preserve",
        help="clear-before-run: DELETE /v1/cache/prefix (and wait for warm sets to re-warm) "
        "before every cell, so each starts as a fresh server would",
    )
    p.add_argument(
        "--admin-token-file",
        metavar="F",
        help="bearer token for DELETE /v1/cache/prefix (or WARMFLEET_ADMIN_TOKEN)",
    )
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per request (default 600)")
    p.add_argument(
        "--write-warm-prompts",
        metavar="F",
        help="write the warm-prompts file for these prompts' shared system prompt (and tools) "
        "to F, for `warmfleet serve --warm-prompts F`, and exit",
    )


def _bench_compare_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("a", metavar="A", help="bench-serve output (CSV or JSON), e.g. cold.csv")
    p.add_argument("b", metavar="B", help="the run to compare with it, e.g. warm.csv")
    p.add_argument("--plot", metavar="PNG", help="also plot TTFT and throughput by concurrency")
    p.add_argument("--format", choices=["table", "markdown", "json"], default="table")


def _audit_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "log",
        metavar="LOG",
        help="JSONL of chat requests ({messages, tools}) or rendered prompts ({prompt})",
    )
    source = p.add_mutually_exclusive_group()
    source.add_argument(
        "--model",
        help="whose template and tokenizer: default (the embedded model), FILE.gguf, an "
        "mlx-lm directory or a Hugging Face id (only its tokenizer is loaded)",
    )
    source.add_argument("--tokenizer", metavar="PATH", help="a Hugging Face tokenizer directory")
    p.add_argument(
        "--prefix-tokens",
        type=int,
        default=512,
        metavar="N",
        help="a prompt's prefix: its static part (before the last message), at most N tokens "
        "(default 512)",
    )
    p.add_argument(
        "--block-size", type=int, default=16, metavar="T", help="for the block hit rate (16)"
    )
    p.add_argument("--format", choices=["table", "json"], default="table")


def _bench_serve(args: argparse.Namespace) -> int:
    from rich.markup import escape

    from warmfleet_daemon.bench import report
    from warmfleet_daemon.bench.prompts import PromptSetError, load_prompt_sets, warm_prompts
    from warmfleet_daemon.bench.serve import BenchError, BenchOptions, run

    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per request
    err = report.console(stderr=True)
    try:
        system = _read_text(args.system_prompt_file).strip() if args.system_prompt_file else None
        sets = load_prompt_sets(args.prompts, system)
        if args.write_warm_prompts:
            entries = warm_prompts(sets)
            if not entries:
                raise BenchError("these prompts share no system prompt or history to warm")
            with open(args.write_warm_prompts, "w", encoding="utf-8") as f:
                json.dump(entries, f, indent=2, ensure_ascii=False)
                f.write("\n")
            print(
                f"wrote {len(entries)} warm prompt(s) to {args.write_warm_prompts}: "
                f"warmfleet serve --warm-prompts {args.write_warm_prompts}"
            )
            return 0
        if not args.url:
            raise BenchError("--url is required (the server to benchmark)")
        token = (
            _read_text(args.admin_token_file).strip()
            if args.admin_token_file
            else os.environ.get("WARMFLEET_ADMIN_TOKEN")
        )
        options = BenchOptions(
            url=args.url,
            prompt_sets=sets,
            concurrency=_int_list(args.concurrency, "--concurrency"),
            model=args.model,
            max_tokens=args.max_tokens,
            requests=args.requests,
            repetitions=args.repetitions,
            tag=args.tag,
            cache_policy=args.cache_policy,
            admin_token=token or None,
            timeout_s=args.timeout,
        )
        with report.RichProgress(err) as progress:
            bench = run(options, progress)
    except (BenchError, PromptSetError, OSError) as exc:
        err.print(f"[red]warmfleet bench-serve: {escape(str(exc))}[/red]", highlight=False)
        return 2
    data_format = args.format if args.format in ("csv", "json") else None
    if args.output:
        fmt = data_format or ("json" if args.output.endswith(".json") else "csv")
        try:
            with open(args.output, "w", encoding="utf-8") as f:
                f.write(report.render_rows(bench, fmt))
        except OSError as exc:
            err.print(f"warmfleet bench-serve: cannot write {args.output}: {exc}", markup=False)
            return 2
    elif data_format:
        sys.stdout.write(report.render_rows(bench, data_format))
    # The table goes to stdout unless stdout carries the rows.
    out = err if data_format and not args.output else report.console()
    out.print(report.results_table(bench))
    if args.output:
        out.print(f"wrote {len(bench.rows)} rows to {args.output}", markup=False)
    report.print_errors(bench, err)
    return 1 if bench.errors else 0


def _bench_compare(args: argparse.Namespace) -> int:
    from warmfleet_daemon.bench import compare, report

    try:
        a_rows, b_rows = report.read_rows(args.a), report.read_rows(args.b)
    except ValueError as exc:
        print(f"warmfleet bench-compare: {exc}", file=sys.stderr)
        return 2
    label_a, label_b = compare.labels(a_rows, b_rows, args.a, args.b)
    rows = compare.compare(a_rows, b_rows)
    if args.format == "markdown":
        sys.stdout.write(compare.markdown(rows, label_a, label_b))
    elif args.format == "json":
        doc = [{**vars(r), "speedup": r.speedup} for r in rows]
        print(json.dumps({"a": label_a, "b": label_b, "rows": doc}, indent=2))
    else:
        report.console().print(compare.comparison_table(rows, label_a, label_b))
    if args.plot:
        try:
            path = compare.plot(rows, label_a, label_b, args.plot)
        except (OSError, ValueError) as exc:
            print(f"warmfleet bench-compare: cannot write {args.plot}: {exc}", file=sys.stderr)
            return 2
        print(f"wrote {path}", file=sys.stderr)
    return 0


def _audit(args: argparse.Namespace) -> int:
    from rich.console import Console

    from warmfleet_daemon.audit import AuditError, audit, print_report, report_json

    if args.prefix_tokens < 1 or args.block_size < 1:
        print("warmfleet audit: --prefix-tokens and --block-size must be >= 1", file=sys.stderr)
        return 2
    try:
        result, meta = audit(
            args.log,
            model=args.model,
            tokenizer_path=args.tokenizer,
            prefix_tokens=args.prefix_tokens,
            block_size=args.block_size,
        )
    except AuditError as exc:
        print(f"warmfleet audit: {exc}", file=sys.stderr)
        return 2
    if args.format == "json":
        print(report_json(result, meta))
        for item in meta["skipped_lines"]:
            print(f"{args.log}:{item['line']}: skipped: {item['error']}", file=sys.stderr)
    else:
        # As wide as the terminal; 120 columns into a file or pipe (rich's 80 is cramped).
        print_report(result, meta, Console(width=None if sys.stdout.isatty() else 120))
    return 0


def _read_text(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def _int_list(text: str, flag: str) -> list[int]:
    from warmfleet_daemon.bench.serve import BenchError

    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError as exc:
        raise BenchError(f"{flag} takes comma-separated integers, e.g. 1,4,8: {text!r}") from exc
    if not values:
        raise BenchError(f"{flag} is empty")
    return values


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


if __name__ == "__main__":
    sys.exit(main())
