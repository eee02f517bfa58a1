"""`warmfleet audit`'s options and handler."""

from __future__ import annotations

import argparse
import sys

from warmfleet_common.logs import setup_logging


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Render and tokenize each request of LOG with the model's template "
        "and tokenizer, then report how many prefixes are unique, the hit rate an "
        "unbounded cache would get (token by token and in blocks), the hit rate if every "
        "prefix matched, where prompts diverge and what varies there (dates, IDs, "
        "versions, reordered blocks), with advice."
    )
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


def run(args: argparse.Namespace) -> int:
    setup_logging("info")
    from warmfleet_daemon.support.blas import ensure_fast_blas

    ensure_fast_blas()  # before the tokenizer loader imports mlx
    from rich.console import Console

    from warmfleet_cli.audit.analysis import AuditError, audit
    from warmfleet_cli.audit.report import print_report, report_json

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
