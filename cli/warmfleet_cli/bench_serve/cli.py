"""`warmfleet bench-serve` and `warmfleet bench-compare`: options and handlers."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from typing import TYPE_CHECKING

from warmfleet_common.logs import setup_logging

if TYPE_CHECKING:
    from rich.console import Console


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Stream chat requests at a server (a warmfleet daemon, mlx_lm.server, "
        "vLLM, ...) per prompt set and concurrency; report TTFT, TPOT, latency, cached "
        "tokens, throughput and the server's hit counters. Run it once against a cold "
        "server (--tag cold) and once against a warm one (--tag warm), then bench-compare."
    )
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
        metavar="N[,N..]",
        help="requests in flight at once, one cell per value (default: 1,4,8; with "
        "--profile-out the decode batch sizes, default 1,2,4,8,16)",
    )
    p.add_argument(
        "--system-prompt-file",
        metavar="F",
        help="use this system prompt in every request (replacing the prompts' own)",
    )
    p.add_argument(
        "--max-tokens",
        type=int,
        help="per request (default: 64; with --profile-out the tokens of each decode "
        "sample, default 32)",
    )
    p.add_argument(
        "--requests",
        type=int,
        metavar="N",
        help="requests per cell (default: the concurrency: one simultaneous burst)",
    )
    p.add_argument(
        "--repetitions",
        type=int,
        metavar="N",
        help="runs of each cell (default 1; with --profile-out of the whole profile, each "
        "figure the median, default 3)",
    )
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
        help="bearer token for DELETE /v1/cache/prefix, and the warm sets and status of "
        "--profile-out (or WARMFLEET_ADMIN_TOKEN)",
    )
    p.add_argument(
        "--api-key",
        metavar="KEY",
        default=os.environ.get("WARMFLEET_API_KEY"),
        help="a client key, for a router or daemon with --api-keys-file (or WARMFLEET_API_KEY)",
    )
    p.add_argument(
        "--tls-ca",
        metavar="FILE",
        help="verify an https server's certificate with this CA bundle (default: the system's)",
    )
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per request (default 600)")
    p.add_argument(
        "--write-warm-prompts",
        metavar="F",
        help="write the warm-prompts file for these prompts' shared system prompt (and tools) "
        "to F, for `warmfleet serve --warm-prompts F`, and exit",
    )
    profile = p.add_argument_group(
        "performance profile",
        "measure a warmfleet daemon (alone: nothing else may use it meanwhile; its prefix "
        "cache is cleared) into a profile for `warmfleet serve --engine sim --profile FILE`: "
        "marginal prefill rates at context positions, decode rates per batch size and per "
        "context, restore rates from RAM and disk, KV and logits bytes",
    )
    profile.add_argument("--profile-out", metavar="FILE", help="write the profile (JSON) to FILE")
    profile.add_argument(
        "--profile-contexts",
        default="512,1024,2048,4096,8192,16384,32768",
        metavar="N[,N..]",
        help="context positions of the prefill and decode rates, those beyond the daemon's "
        "context left out (default: 512,1024,2048,4096,8192,16384,32768)",
    )
    profile.add_argument(
        "--profile-name", metavar="NAME", help="the profile's name (default: FILE's name)"
    )
    profile.add_argument(
        "--profile-machine",
        metavar="TEXT",
        help="the machine measured: chip, memory (default for a local daemon: this "
        "machine's CPU model, cores, memory and OS; required otherwise)",
    )
    profile.add_argument(
        "--profile-model",
        metavar="TEXT",
        help="the model measured, with its precision (default: the served model's id)",
    )


def add_compare_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("a", metavar="A", help="bench-serve output (CSV or JSON), e.g. cold.csv")
    p.add_argument("b", metavar="B", help="the run to compare with it, e.g. warm.csv")
    p.add_argument("--plot", metavar="PNG", help="also plot TTFT and throughput by concurrency")
    p.add_argument("--format", choices=["table", "markdown", "json"], default="table")


def serve(args: argparse.Namespace) -> int:
    setup_logging("info")
    from rich.markup import escape

    from warmfleet_cli.bench_serve import report
    from warmfleet_cli.bench_serve.prompt_sets import PromptSetError, load_prompt_sets, warm_prompts
    from warmfleet_cli.bench_serve.serve import BenchError, BenchOptions, run

    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per request
    err = report.console(stderr=True)
    if args.profile_out:
        return _profile(args, err)
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
        token = _admin_token(args)
        options = BenchOptions(
            url=args.url,
            prompt_sets=sets,
            concurrency=_int_list(args.concurrency or "1,4,8", "--concurrency"),
            model=args.model,
            max_tokens=64 if args.max_tokens is None else args.max_tokens,
            requests=args.requests,
            repetitions=1 if args.repetitions is None else args.repetitions,
            tag=args.tag,
            cache_policy=args.cache_policy,
            admin_token=token or None,
            timeout_s=args.timeout,
            api_key=args.api_key,
            tls_ca=args.tls_ca,
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


def _profile(args: argparse.Namespace, err: Console) -> int:
    """`--profile-out`: measure the daemon, write its profile, print a summary."""
    from rich.markup import escape

    from warmfleet_cli.bench_serve import profile_build as build
    from warmfleet_cli.bench_serve.profiling import ProfileOptions, is_local, run_profile
    from warmfleet_cli.bench_serve.serve import BenchError
    from warmfleet_common.perf_profile import dump_profile

    try:
        if not args.url:
            raise BenchError("--url is required (the daemon to measure)")
        machine = args.profile_machine
        if not machine:
            if not is_local(args.url):
                raise BenchError("--profile-machine is required for a daemon on another machine")
            machine = build.this_machine()
        options = ProfileOptions(
            url=args.url,
            contexts=_int_list(args.profile_contexts, "--profile-contexts"),
            batches=_int_list(args.concurrency or "1,2,4,8,16", "--concurrency"),
            repetitions=3 if args.repetitions is None else args.repetitions,
            decode_tokens=32 if args.max_tokens is None else args.max_tokens,
            model=args.model,
            admin_token=_admin_token(args),
            timeout_s=args.timeout,
            api_key=args.api_key,
            tls_ca=args.tls_ca,
        )
        measured = run_profile(options, _Notes(err))
        profile = build.build_profile(
            measured,
            name=args.profile_name or build.profile_name(args.profile_out),
            machine=machine,
            model=args.profile_model,
        )
        with open(args.profile_out, "w", encoding="utf-8") as f:
            f.write(dump_profile(profile))
    except (BenchError, OSError, ValueError) as exc:
        err.print(f"[red]warmfleet bench-serve: {escape(str(exc))}[/red]", highlight=False)
        return 2
    print(build.summary(profile))
    print(f"wrote {args.profile_out}")
    return 0


class _Notes:
    def __init__(self, console: Console) -> None:
        self._console = console

    def note(self, text: str) -> None:
        self._console.print(text, style="dim", markup=False, highlight=False)


def _admin_token(args: argparse.Namespace) -> str | None:
    token = (
        _read_text(args.admin_token_file).strip()
        if args.admin_token_file
        else os.environ.get("WARMFLEET_ADMIN_TOKEN")
    )
    return token or None


def compare(args: argparse.Namespace) -> int:
    setup_logging("info")
    from warmfleet_cli.bench_serve import compare as comparison
    from warmfleet_cli.bench_serve import report

    try:
        a_rows, b_rows = report.read_rows(args.a), report.read_rows(args.b)
    except ValueError as exc:
        print(f"warmfleet bench-compare: {exc}", file=sys.stderr)
        return 2
    label_a, label_b = comparison.labels(a_rows, b_rows, args.a, args.b)
    rows = comparison.compare(a_rows, b_rows)
    if args.format == "markdown":
        sys.stdout.write(comparison.markdown(rows, label_a, label_b))
    elif args.format == "json":
        doc = [{**vars(r), "speedup": r.speedup} for r in rows]
        print(json.dumps({"a": label_a, "b": label_b, "rows": doc}, indent=2))
    else:
        report.console().print(comparison.comparison_table(rows, label_a, label_b))
    if args.plot:
        try:
            path = comparison.plot(rows, label_a, label_b, args.plot)
        except (OSError, ValueError) as exc:
            print(f"warmfleet bench-compare: cannot write {args.plot}: {exc}", file=sys.stderr)
            return 2
        print(f"wrote {path}", file=sys.stderr)
    return 0


def _read_text(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def _int_list(text: str, flag: str) -> list[int]:
    from warmfleet_cli.bench_serve.serve import BenchError

    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError as exc:
        raise BenchError(f"{flag} takes comma-separated integers, e.g. 1,4,8: {text!r}") from exc
    if not values:
        raise BenchError(f"{flag} is empty")
    return values
