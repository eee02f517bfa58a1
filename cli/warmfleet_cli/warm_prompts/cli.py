"""`warmfleet warm-prompts capture`'s options and handler."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

CAPTURE_DESCRIPTION = """\
Listen on HOST:PORT for one request of an agent (POST /v1/chat/completions, /v1/messages
or /v1/responses), write the warm prompt of its static part (system prompt, tools, and
leading messages, in that API's shape) to FILE, answer the agent with a short reply that
ends its session cleanly, and exit. Point the agent at it once, e.g.
ANTHROPIC_BASE_URL=http://127.0.0.1:PORT claude -p hi (Claude Code), or a Codex model
provider with base_url = "http://127.0.0.1:PORT/v1" and wire_api = "responses". FILE is
ready for `warmfleet serve --warm-prompts FILE`; the WarmPromptSet that warms it on every
WarmNode is printed on stdout. An existing FILE keeps its other entries."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = "Warm prompts taken from the agents themselves."
    verbs = p.add_subparsers(dest="warm_prompts_command", required=True, metavar="VERB")
    capture = verbs.add_parser(
        "capture",
        help="record an agent's first request and write its warm prompt",
        description=CAPTURE_DESCRIPTION,
    )
    capture.add_argument("--out", required=True, metavar="FILE", help="the warm-prompts file")
    capture.add_argument(
        "--format",
        choices=["json", "yaml"],
        help="of FILE (default: yaml for .yaml/.yml, else json)",
    )
    capture.add_argument(
        "--name",
        help="the prompt's name (default: claude-code or codex from the agent's User-Agent, "
        "else chat-agent, anthropic-agent or responses-agent)",
    )
    capture.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1)")
    capture.add_argument("--port", type=int, default=8100, help="port to listen on (8100; 0: any)")
    capture.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="give up when no request came in this long (600)",
    )


def run(args: argparse.Namespace) -> int:
    from warmfleet_cli.warm_prompts.capture import Captured, CaptureFailed, CaptureServer, bind
    from warmfleet_cli.warm_prompts.files import (
        OutputError,
        check_writable,
        dump_yaml,
        existing_entries,
        format_of,
        merged,
        warm_prompt_set,
        write,
    )
    from warmfleet_common.contract import PROMPT_NAME
    from warmfleet_common.logs import setup_logging

    setup_logging("warning")  # what was not captured, and why

    def fail(message: str, code: int = 1) -> int:
        print(f"warmfleet warm-prompts capture: {message}", file=sys.stderr)
        return code

    if args.name is not None and not re.fullmatch(PROMPT_NAME, args.name):
        return fail(f"--name {args.name!r}: letters, digits, -, _ and . (at most 63)", 2)
    if args.timeout <= 0:
        return fail("--timeout must be > 0", 2)
    out = Path(args.out)
    fmt = format_of(out, args.format)
    try:
        check_writable(out)
        entries = existing_entries(out)
    except OutputError as exc:
        return fail(str(exc), 2)

    def save(captured: Captured) -> str:
        entry = captured.prompt.model_dump(mode="json", exclude_none=True)
        write(out, merged(entries, entry), fmt)
        return (
            f"warmfleet captured the warm prompt {captured.prompt.name!r} ({captured.api} "
            f"shape) of this request to {out}. Nothing was generated: this session can end."
        )

    try:
        sock = bind(args.host, args.port)
    except OSError as exc:
        return fail(f"cannot listen on {args.host}:{args.port}: {exc}", 2)
    server = CaptureServer(sock, save, name=args.name, timeout=args.timeout)
    url = f"http://{args.host}:{server.port}"
    print(
        f"Waiting for one request on {url} (at most {args.timeout:.0f} s). For example:\n"
        f"  ANTHROPIC_BASE_URL={url} claude -p hi\n"
        f'  codex exec hi, with a model provider: base_url = "{url}/v1", wire_api = "responses"',
        file=sys.stderr,
        flush=True,
    )
    try:
        captured = server.run()
    except CaptureFailed as exc:
        return fail(f"nothing captured: {exc}")
    except KeyboardInterrupt:
        return fail("interrupted: nothing captured", 130)
    finally:
        sock.close()
    if captured is None:
        return fail(f"no request came in {args.timeout:.0f} s: nothing captured")
    entry = captured.prompt.model_dump(mode="json", exclude_none=True)
    print(
        f"Captured {captured.prompt.name!r} ({captured.api} shape) from "
        f"{captured.client or 'a client'} and wrote it to {out}. Warm it with "
        f"`warmfleet serve --warm-prompts {out}` or `warmfleet up --warm {out}`, or apply "
        "this WarmPromptSet (kubectl apply --server-side -f -):",
        file=sys.stderr,
    )
    sys.stdout.write(dump_yaml(warm_prompt_set(entry)))
    return 0
