"""`make run`, the README's first command: `warmfleet up` with two daemons on the
embedded model, the operator in local mode warming the example prompts on both, and the
router in front; the README's chat goes through the router and finds them cached; the
fleet says how to point each coding agent at it, then nothing while it idles; one
Ctrl-C stops everything, with no traceback; started again on the same state directory,
it comes back warm (its warm prompts read back, not prefilled)."""

from __future__ import annotations

import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import yaml

from support.processes import free_port
from warmfleet_cli.up import port_free

ROOT = Path(__file__).resolve().parents[2]


def make_run_arguments(port: int) -> list[str]:
    """The arguments `make run` passes to `warmfleet up` (make prints, runs nothing)."""
    printed = subprocess.run(
        ["make", "-s", "-n", "run", f"PORT={port}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.replace("\\\n", " ")
    words = next(shlex.split(line) for line in printed.splitlines() if " up " in line)
    assert words[0].endswith("warmfleet"), printed
    return words[words.index("up") + 1 :]


def three_free_ports() -> int:
    for _ in range(50):
        port = free_port()
        if port + 2 < 65536 and all(port_free("127.0.0.1", port + i) for i in range(3)):
            return port
    raise RuntimeError("no three consecutive free ports")


def start_up(args: list[str], folder: Path, log_path: Path) -> subprocess.Popen[bytes]:
    with open(log_path, "wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "warmfleet_cli", "up", *args, "--dir", str(folder)],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def wait_warm(up: subprocess.Popen[bytes], router: str, folder: Path, log_path: Path) -> str:
    """The fleet's log once it said it is ready and both daemons hold both warm prompts."""
    deadline = time.monotonic() + 300
    while True:
        assert up.poll() is None, log_path.read_text()
        assert time.monotonic() < deadline, log_path.read_text()
        text = log_path.read_text()
        if "warmfleet up: ready" in text:
            token = (folder / "admin-token").read_text().strip()
            auth = {"Authorization": f"Bearer {token}"}  # the status's detail is admin's
            status = httpx.get(f"{router}/v1/router/status", headers=auth, timeout=5)
            backends = status.json()["backends"]
            # The example set (`up`'s learning set, `learned`, holds nothing learned yet).
            sets = [s for b in backends for s in b["warm_sets"] if s["name"] != "learned"]
            if len(sets) == 2 and all(s["warm"] == s["total"] == 2 for s in sets):
                return text
        time.sleep(0.5)


def stop(up: subprocess.Popen[bytes], log_path: Path) -> str:
    up.send_signal(signal.SIGINT)
    try:
        code = up.wait(timeout=60)
    except subprocess.TimeoutExpired:
        up.kill()
        raise
    text = log_path.read_text()
    assert code == 0, text
    assert "warmfleet up: stopped" in text and "Traceback" not in text, text
    return text


def test_make_run_starts_the_fleet_and_the_readme_chat_hits_the_warm_prompts(
    tmp_path: Path,
) -> None:
    port = three_free_ports()
    args = make_run_arguments(port)
    assert args[args.index("--nodes") + 1] == "2"
    assert args[args.index("--max-context") + 1] == "32768"  # agents' first requests fit
    args[args.index("--state-dir") + 1] = str(tmp_path / "state")  # not the checkout's
    warm_file = ROOT / args[args.index("--warm") + 1]
    log_path = tmp_path / "up.log"
    up = start_up(args, tmp_path, log_path)
    router = f"http://127.0.0.1:{port}"
    try:
        # Every component says where it listens, then the fleet is ready and warm.
        text = wait_warm(up, router, tmp_path, log_path)
        for line in (f"daemon node-1    http://127.0.0.1:{port + 1}", "operator       local mode",
                     f"router         http://127.0.0.1:{port}"):  # fmt: skip
            assert f"warmfleet up: {line}" in text, text
        assert "a 32,768-token context" in text, text
        agents = ("Claude Code     ANTHROPIC_BASE_URL=", "Codex           codex -c",
                  "Qwen Code       OPENAI_BASE_URL=", "opencode        opencode.json")  # fmt: skip
        for agent in agents:
            assert agent in text, text
        # Claude Code compacts at 24,000 tokens, before the 32k context ends
        assert "CLAUDE_CODE_AUTO_COMPACT_WINDOW=100000 CLAUDE_AUTOCOMPACT_PCT_OVERRIDE=30 " in text
        assert "QWEN_CODE_API_TIMEOUT_MS=1800000 qwen" in text

        token = (tmp_path / "admin-token").read_text().strip()
        warm = httpx.get(
            f"http://127.0.0.1:{port + 1}/v1/warm-sets/default/warm-prompts",
            headers={"Authorization": f"Bearer {token}"},
        ).json()
        tokens = {p["name"]: p["tokens"] for p in warm["prompts"]}

        oncall = yaml.safe_load(warm_file.read_text())[0]
        client = openai.OpenAI(base_url=f"{router}/v1", api_key="unused", max_retries=0)
        seen = set()
        for question in ["Pods in shop crash.", "The checkout API returns 502."]:
            raw = client.chat.completions.with_raw_response.create(
                model="default",
                messages=[*oncall["messages"], {"role": "user", "content": question}],
                tools=oncall["tools"],
                max_tokens=8,
                temperature=0,
            )
            reply = raw.parse()
            seen.add(raw.headers["x-warmfleet-backend"])
            assert reply.usage is not None and reply.usage.prompt_tokens_details is not None
            assert reply.usage.prompt_tokens_details.cached_tokens == tokens["oncall"] > 0
        assert seen and seen <= {"node-1", "node-2"}

        # Idle, the fleet prints nothing (its components poll one another every few s).
        before = log_path.read_text()
        time.sleep(15)
        assert log_path.read_text() == before
    finally:
        stop(up, log_path)
    assert all(port_free("127.0.0.1", port + i) for i in range(3))

    # Started again on its state directory: the warm prompts come back from disk.
    again = start_up(args, tmp_path, tmp_path / "again.log")
    try:
        wait_warm(again, router, tmp_path, tmp_path / "again.log")
        token = (tmp_path / "admin-token").read_text().strip()
        for node in (port + 1, port + 2):
            warm = httpx.get(
                f"http://127.0.0.1:{node}/v1/warm-sets/default/warm-prompts",
                headers={"Authorization": f"Bearer {token}"},
            ).json()
            assert [p["computed_tokens"] for p in warm["prompts"]] == [0, 0], warm
    finally:
        stop(again, tmp_path / "again.log")
