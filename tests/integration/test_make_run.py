"""`make run`, the README's first command: the embedded model with the example warm
prompts, warmed in the background, and the first request finds them cached."""

from __future__ import annotations

import shlex
import subprocess
import time
from pathlib import Path

import httpx
import openai
import yaml

from daemons import Daemon, free_port, start_daemon

ROOT = Path(__file__).resolve().parents[2]


def make_run_arguments(port: int) -> list[str]:
    """The arguments `make run` passes to `warmfleet serve` (make prints, runs nothing)."""
    printed = subprocess.run(
        ["make", "-s", "-n", "run", f"PORT={port}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.replace("\\\n", " ")
    words = next(shlex.split(line) for line in printed.splitlines() if " serve " in line)
    assert words[0].endswith("warmfleet"), printed
    return words[words.index("serve") + 1 :]


def test_make_run_warms_the_example_prompts_and_the_first_request_hits(tmp_path) -> None:
    port = free_port()
    args = make_run_arguments(port)
    warm_file = Path(args[args.index("--warm-prompts") + 1])
    daemon: Daemon = start_daemon(*args, "--log-level", "info", port=port)
    try:
        deadline = time.monotonic() + 180
        while "Warm-up done (strict-prefix): 2 completed" not in daemon.log():
            assert time.monotonic() < deadline, daemon.log()
            time.sleep(0.2)
        assert httpx.get(f"{daemon.url}/readyz", params={"warm": 1}).status_code == 200
        warm = httpx.get(f"{daemon.url}/v1/warm-sets/local/warm-prompts").json()
        tokens = {p["name"]: p["tokens"] for p in warm["prompts"]}

        oncall = yaml.safe_load((ROOT / warm_file).read_text())[0]
        client = openai.OpenAI(base_url=f"{daemon.url}/v1", api_key="unused", max_retries=0)
        reply = client.chat.completions.create(
            model="default",
            messages=[*oncall["messages"], {"role": "user", "content": "Pods in shop crash."}],
            tools=oncall["tools"],
            max_tokens=8,
            temperature=0,
        )
        assert reply.usage is not None and reply.usage.prompt_tokens_details is not None
        assert reply.usage.prompt_tokens_details.cached_tokens == tokens["oncall"] > 0
    finally:
        daemon.stop()
