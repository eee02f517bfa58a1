"""How much of each coding agent's first request a captured warm prompt covers, with the
embedded model's template and tokenizer: in the session's own directory on the day of
the capture, on the next day, and in another project directory.

    .venv/bin/python bench/agent_layouts.py --agents ~/agents [--only AGENT ...]
        [--env NAME=VALUE ...] [--qwen-settings JSON] [--json out.json]

--agents is a directory where `npm install @anthropic-ai/claude-code@2.1.332
@openai/codex@0.171.0 opencode-ai@1.18.33 @qwen-code/qwen-code@0.24.4` was run. Each CLI
is run headless (as the README's ready block points it, one `say hi` each) against a
recording endpoint that keeps its first request with tools (the agent's own: opencode's
title request has none) and answers it with the capture's short reply; twice, from two
project directories of one user. Then, rendered as the daemon renders them:

first request  the tokens of the request from project A
warm prompt    what `warmfleet warm-prompts capture` keeps of it (what comes before the
               first user message), as the daemon prefills it: its share of the request
next day       the tokens the warm prompt shares with A's request once every date in it
               reads as tomorrow's (no agent can be run on another day here)
other project  the tokens it shares with the request from project B (same HOME)

--env sets a variable for every CLI (CLAUDE_CODE_DISABLE_AUTO_MEMORY=1, ...);
--qwen-settings is written as Qwen Code's ~/.qwen/settings.json. Nothing here is timed:
tokens only.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import uvicorn
from harness.processes import free_port, wait_until
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from warmfleet_cli.warm_prompts import replies
from warmfleet_cli.warm_prompts.capture import ROUTES
from warmfleet_common.agent_apis.prefix import warm_prompt
from warmfleet_common.agent_apis.shapes import ApiName

MODEL = "default"


@dataclass
class Layout:
    agent: str
    first_request: int
    warm_prompt: int
    next_day: int
    other_project: int

    def row(self) -> str:
        def share(tokens: int) -> str:
            return f"{tokens:,} ({tokens / self.first_request:.1%})"

        return (
            f"| {self.agent} | {self.first_request:,} | {share(self.warm_prompt)} | "
            f"{share(self.next_day)} | {share(self.other_project)} |"
        )


@dataclass
class Recorded:
    api: ApiName
    path: str
    body: dict[str, Any]


@contextmanager
def recording() -> Iterator[tuple[str, list[Recorded]]]:
    """An endpoint of the three APIs that keeps every request with tools and answers
    each with the capture's short reply."""
    seen: list[Recorded] = []

    async def handle(request: Request) -> Response:
        api = ROUTES[request.url.path]
        body = json.loads(await request.body())
        if body.get("tools"):
            seen.append(Recorded(api, request.url.path, body))
        model = str(body.get("model") or MODEL)
        if body.get("stream") is True:
            events = replies.stream(api, model, "Recorded.")
            return StreamingResponse(events, media_type="text/event-stream")
        return JSONResponse(replies.reply(api, model, "Recorded."))

    app = Starlette(routes=[Route(p, handle, methods=["POST"]) for p in ROUTES])
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, port=port, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started, "the recording endpoint", timeout=30, poll=0.05)
    try:
        yield f"http://127.0.0.1:{port}", seen
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def run_claude(bin_dir: Path, home: Path, cwd: Path, url: str) -> None:
    env = {
        "ANTHROPIC_BASE_URL": url,
        "ANTHROPIC_API_KEY": "unused",
        "ANTHROPIC_MODEL": MODEL,
        "ANTHROPIC_SMALL_FAST_MODEL": MODEL,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
    _run([str(bin_dir / "claude"), "-p", "say hi"], home, cwd, env)


def run_codex(bin_dir: Path, home: Path, cwd: Path, url: str) -> None:
    provider = f'{{name="warmfleet", base_url="{url}/v1", wire_api="responses"}}'
    command = [str(bin_dir / "codex"), "exec", "--skip-git-repo-check", "-m", MODEL]
    command += ["-c", "model_provider=warmfleet", "-c", f"model_providers.warmfleet={provider}"]
    (home / ".codex").mkdir(exist_ok=True)
    _run([*command, "say hi"], home, cwd, {"CODEX_HOME": str(home / ".codex")})


def run_opencode(bin_dir: Path, home: Path, cwd: Path, url: str) -> None:
    provider = {"npm": "@ai-sdk/openai-compatible", "options": {"baseURL": f"{url}/v1"}}
    config = {"provider": {"warmfleet": {**provider, "models": {MODEL: {}}}}}
    (cwd / "opencode.json").write_text(json.dumps(config))
    _run([str(bin_dir / "opencode"), "run", "-m", f"warmfleet/{MODEL}", "say hi"], home, cwd, {})


def run_qwen(bin_dir: Path, home: Path, cwd: Path, url: str) -> None:
    env = {"OPENAI_BASE_URL": f"{url}/v1", "OPENAI_API_KEY": "unused", "OPENAI_MODEL": MODEL}
    _run([str(bin_dir / "qwen"), "--auth-type", "openai", "say hi"], home, cwd, env)


AGENTS: dict[str, Callable[[Path, Path, Path, str], None]] = {
    "claude-code": run_claude,
    "codex": run_codex,
    "opencode": run_opencode,
    "qwen-code": run_qwen,
}


EXTRA_ENV: dict[str, str] = {}  # --env


def _run(command: list[str], home: Path, cwd: Path, env: dict[str, str]) -> None:
    full = {"PATH": os.environ["PATH"], "HOME": str(home), **env, **EXTRA_ENV}
    subprocess.run(
        command, env=full, cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True, timeout=600
    )


def dates(day: datetime.date) -> list[str]:
    """The ways the agents write a day (opencode: `Thu Dec 03 2026`)."""
    return [
        day.isoformat(),
        day.strftime("%a %b %d %Y"),
        f"{day.strftime('%A, %B')} {day.day}, {day.year}",
        f"{day.strftime('%B')} {day.day}, {day.year}",
        f"{day.month}/{day.day}/{day.year}",
    ]


def moved_a_day(value: Any, today: datetime.date) -> Any:
    """`value` with every date of today written as tomorrow's."""
    if isinstance(value, str):
        for now, then in zip(dates(today), dates(today + datetime.timedelta(days=1))):
            value = value.replace(now, then)
        return value
    if isinstance(value, list):
        return [moved_a_day(v, today) for v in value]
    if isinstance(value, dict):
        return {k: moved_a_day(v, today) for k, v in value.items()}
    return value


def measure(name: str, a: Recorded, b: Recorded, builder: Any) -> Layout:
    from warmfleet_router.routes import ROUTES

    by_path = {route.path: route for route in ROUTES}

    def tokens(recorded: Recorded) -> tuple[int, ...]:
        prompt = by_path[recorded.path].prompt_of(recorded.body)
        assert prompt is not None
        chat = builder.chat(prompt.messages, prompt.tools, template_kwargs=prompt.template_kwargs)
        return tuple(chat.tokens)

    chat, options = warm_prompt(a.api, a.body, name).chat()
    warm = builder.shared_prefix(chat.messages, chat.tools, chat.template_kwargs(options)).tokens
    first = tokens(a)
    assert first[: len(warm)] == tuple(warm), f"{name}: the warm prompt is not a prefix"
    tomorrow = tokens(Recorded(a.api, a.path, moved_a_day(a.body, datetime.date.today())))
    return Layout(name, len(first), len(warm), _shared(warm, tomorrow), _shared(warm, tokens(b)))


def _shared(a: Sequence[int], b: Sequence[int]) -> int:
    """The tokens two prompts share before they part."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--agents", type=Path, required=True)
    p.add_argument("--only", nargs="*", choices=sorted(AGENTS), default=sorted(AGENTS))
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE")
    p.add_argument("--qwen-settings", metavar="JSON")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    EXTRA_ENV.update(item.split("=", 1) for item in args.env)
    bin_dir = args.agents / "node_modules" / ".bin"

    from warmfleet_common.prompts import PromptBuilder
    from warmfleet_daemon.models.loader import load_gguf_tokenizer_only

    builder = PromptBuilder(load_gguf_tokenizer_only())
    layouts: list[Layout] = []
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        projects = [Path(tmp) / "project-a", Path(tmp) / "service-b"]
        for folder in (home, *projects):
            folder.mkdir()
        for folder in projects:
            (folder / "README.md").write_text(f"# {folder.name}\n")
        if args.qwen_settings:
            (home / ".qwen").mkdir()
            (home / ".qwen" / "settings.json").write_text(args.qwen_settings)
        for name in args.only:
            recorded: list[Recorded] = []
            for project in projects:
                with recording() as (url, seen):
                    AGENTS[name](bin_dir, home, project, url)
                if not seen:
                    raise SystemExit(f"{name} sent no request with tools from {project}")
                recorded.append(seen[0])
            layouts.append(measure(name, recorded[0], recorded[1], builder))
            print(layouts[-1], flush=True)
    print("| agent | first request | warm prompt | next day | other project |")
    print("|---|---|---|---|---|")
    for layout in layouts:
        print(layout.row())
    if args.json:
        args.json.write_text(json.dumps([asdict(x) for x in layouts], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
