"""`warmfleet up`: the whole fleet on one machine, the way it runs on many.

N daemons on consecutive ports after the router's, the operator in local mode on a
folder of WarmNode, Secret and WarmPromptSet YAML written for them (plus the warm sets
of `--warm`: a folder's WarmPromptSets and ConfigMaps, a file of them, or a warm-prompts
file, which becomes a WarmPromptSet for every node), and the router on `--port`. Each component is
a child process in its own process group, so one Ctrl-C reaches `up` alone and `up`
stops each child exactly once (a second SIGINT would make uvicorn skip its shutdown).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml
from pydantic import ValidationError

from warmfleet_common.contract import WarmPrompt
from warmfleet_common.crd import API_VERSION, FLEET_LABEL, POOL_LABEL
from warmfleet_router.policy import POLICIES

TOKEN_SECRET = "warmfleet-daemon-token"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nodes", type=int, default=2, help="daemons to start (default 2)")
    p.add_argument("--model", default="default", help="what every daemon serves")
    p.add_argument(
        "--engine",
        choices=["mlx", "sim"],
        default="mlx",
        help="sim: simulated Macs (`serve --engine sim`), up to 256, many to a process",
    )
    p.add_argument("--profile", metavar="NAME|FILE", help="--engine sim: the Macs' profile")
    p.add_argument(
        "--sim-speed", type=float, metavar="X", help="--engine sim: time runs X times faster"
    )
    p.add_argument(
        "--sim-per-process",
        type=int,
        default=50,
        metavar="N",
        help="--engine sim: simulated daemons per process (default 50)",
    )
    p.add_argument(
        "--warm",
        metavar="PATH",
        help="WarmPromptSets to keep warm: a folder of YAML, a file of WarmPromptSets, or a "
        "warm-prompts file (as `warmfleet warm-prompts capture` prints and writes them)",
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="the router's; daemons take the next")
    p.add_argument("--policy", choices=POLICIES, default="prefix", help="the router's policy")
    p.add_argument("--dir", help="write the fleet's YAML here (default: a temporary folder)")
    p.add_argument(
        "--prometheus",
        action="store_true",
        help="also run Debian's prometheus scraping every component",
    )
    p.add_argument("--prometheus-port", type=int, default=9090)
    p.add_argument("--cache-memory-mb", type=int, help="each daemon's prefix-cache budget")
    p.add_argument("--block-size", type=int, help="each daemon's cache block size")
    p.add_argument(
        "--max-context",
        type=int,
        metavar="N",
        help="each daemon's context in tokens, beyond the model's own if need be (Claude "
        "Code's first request is ~12k tokens: the embedded model's 8,192 are too few)",
    )
    p.add_argument(
        "--max-output-tokens",
        type=int,
        metavar="N",
        help="each daemon's longest response, whatever a request asks or leaves open (Codex "
        "sets no limit)",
    )
    p.add_argument(
        "--state-dir",
        metavar="DIR",
        help="each daemon keeps its warm sets, their snapshots and its disk tier in DIR/node-N, "
        "so a restart of the fleet comes back warm (default: nothing kept)",
    )
    p.add_argument(
        "--log-level",
        default="warning",
        help="of every component (default warning: the fleet says only what goes wrong, and "
        "what `up` and the operator report)",
    )
    p.add_argument(
        "--access-log",
        action="store_true",
        help="every component logs every request, the polls of one another too",
    )


@dataclass
class Child:
    name: str
    process: subprocess.Popen[bytes]


def fleet_documents(nodes: int, host: str, first_port: int, token: str) -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = [
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": TOKEN_SECRET, "namespace": "default"},
            "stringData": {"token": token},
        }
    ]
    for i in range(nodes):
        docs.append(
            {
                "apiVersion": API_VERSION,
                "kind": "WarmNode",
                "metadata": {
                    "name": f"node-{i + 1}",
                    "labels": {FLEET_LABEL: "local", POOL_LABEL: "agents"},
                },
                "spec": {
                    "url": f"http://{host}:{first_port + i}",
                    "adminTokenSecretRef": {"name": TOKEN_SECRET, "key": "token"},
                },
            }
        )
    return docs


def warm_documents(path: Path) -> list[dict[str, Any]]:
    """The WarmPromptSets (and the ConfigMaps they read) that `--warm PATH` names: a
    folder's, a file of them (the one `warmfleet warm-prompts capture` prints), or a
    warm-prompts file (the one it writes)."""
    if path.is_dir():
        docs = []
        for file in sorted(path.glob("*.y*ml")):
            for doc in yaml.safe_load_all(file.read_text()):
                if isinstance(doc, dict) and doc.get("kind") in ("WarmPromptSet", "ConfigMap"):
                    docs.append(doc)
        return docs
    documents = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    if documents and all(isinstance(d, dict) and "kind" in d for d in documents):
        docs = [d for d in documents if d["kind"] in ("WarmPromptSet", "ConfigMap")]
        if not any(d["kind"] == "WarmPromptSet" for d in docs):
            raise ValueError(f"{path}: no WarmPromptSet in it")
        return docs
    if len(documents) != 1:
        raise ValueError(f"{path}: expected one list of prompts, not {len(documents)} documents")
    return [warm_prompts_set(path, documents[0])]


def warm_prompts_set(path: Path, document: Any) -> dict[str, Any]:
    """A warm-prompts file's `document` (what `warmfleet serve --warm-prompts` reads: a list
    of entries with name/messages/tools, anthropic or responses, or vllm-mlx's list of
    message lists; either also as `{prompts: [...]}`) as a WarmPromptSet."""
    entries = document.get("prompts") if isinstance(document, dict) else document
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"{path}: expected a list of prompts")
    prompts = []
    for i, entry in enumerate(entries):
        raw = entry if isinstance(entry, dict) else {"name": f"prompt-{i + 1}", "messages": entry}
        try:
            prompt = WarmPrompt.model_validate(raw)
        except ValidationError as exc:
            raise ValueError(f"{path}: prompt {i + 1}: {exc}") from exc
        prompts.append(prompt.model_dump(exclude_none=True))
    name = "".join(c if c.isalnum() else "-" for c in path.stem.lower()).strip("-") or "warm"
    return {
        "apiVersion": API_VERSION,
        "kind": "WarmPromptSet",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"nodeSelector": {"matchLabels": {FLEET_LABEL: "local"}}, "prompts": prompts},
    }


def port_free(host: str, port: int) -> bool:
    """Nothing listens there (connections closing in TIME_WAIT do not count: the servers
    bind with SO_REUSEADDR too)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


MAX_NODES = {"mlx": 64, "sim": 256}


def run(args: argparse.Namespace) -> int:
    limit = MAX_NODES[args.engine]
    if not 1 <= args.nodes <= limit:
        return _fail(f"--nodes must be between 1 and {limit} (--engine {args.engine})")
    if args.engine == "sim" and not args.profile:
        return _fail("--engine sim needs --profile NAME|FILE")
    if args.engine == "sim" and args.model != "default":
        return _fail("--engine sim: the profile names the model (leave --model out)")
    if args.engine != "sim" and (args.profile or args.sim_speed is not None):
        return _fail("--profile and --sim-speed only with --engine sim")
    if args.sim_per_process < 1:
        return _fail("--sim-per-process must be at least 1")
    ports = [args.port + i for i in range(args.nodes + 1)]
    busy = [p for p in ports if not port_free(args.host, p)]
    if busy:
        return _fail(f"port(s) {', '.join(map(str, busy))} on {args.host} are in use")
    token = secrets.token_urlsafe(24)
    folder = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="warmfleet-up-"))
    folder.mkdir(parents=True, exist_ok=True)
    try:
        warm = warm_documents(Path(args.warm)) if args.warm else []
    except (OSError, ValueError, yaml.YAMLError) as exc:
        return _fail(f"--warm {args.warm}: {exc}")
    docs = fleet_documents(args.nodes, args.host, args.port + 1, token)
    (folder / "fleet.yaml").write_text(yaml.safe_dump_all(docs, sort_keys=False))
    (folder / "warm-sets.yaml").write_text(yaml.safe_dump_all(warm, sort_keys=False))
    token_file = folder / "admin-token"
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)

    children: list[Child] = []
    stopping = False

    def on_signal(signum: int, _: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    me = [sys.executable, "-m", "warmfleet_cli"]
    try:
        for first, count in _daemon_groups(args):
            port = args.port + first
            cmd = [
                *me, "serve", "--host", args.host, "--port", str(port),
                "--admin-token-file", str(token_file),
            ]  # fmt: skip
            if args.engine == "sim":
                cmd += [
                    "--engine", "sim", "--profile", args.profile, "--daemon-name", "node",
                    "--nodes", str(count), "--first-node", str(first),
                ]  # fmt: skip
                if args.sim_speed is not None:
                    cmd += ["--sim-speed", str(args.sim_speed)]
            else:
                cmd += ["--model", args.model, "--daemon-name", f"node-{first}"]
            if args.cache_memory_mb is not None:
                cmd += ["--cache-memory-mb", str(args.cache_memory_mb)]
            if args.block_size is not None:
                cmd += ["--block-size", str(args.block_size)]
            if args.max_context is not None:
                cmd += ["--max-context", str(args.max_context)]
            if args.max_output_tokens is not None:
                cmd += ["--max-output-tokens", str(args.max_output_tokens)]
            if args.state_dir is not None:  # simulated daemons add node-I themselves
                own = "" if args.engine == "sim" else f"node-{first}"
                cmd += ["--state-dir", str(Path(args.state_dir) / own)]
            cmd += ["--log-level", args.log_level] + (["--access-log"] if args.access_log else [])
            last = first + count - 1
            name = f"node-{first}" if count == 1 else f"node-{first}..{last}"
            children.append(Child(name, _spawn(cmd)))
            if args.engine == "sim":
                _say(f"simulated      {name} http://{args.host}:{port}-{port + count - 1}  "
                     f"(profile {args.profile})")  # fmt: skip
            else:
                _say(f"daemon node-{first:<4} http://{args.host}:{port}  (model {args.model})")
        children.append(
            Child(
                "operator",
                _spawn([*me, "operator", "--local", str(folder), "--resync-seconds", "5"]),
            )
        )
        _say(f"operator       local mode on {folder} ({args.nodes} WarmNodes, "
             f"{sum(d.get('kind') == 'WarmPromptSet' for d in warm)} WarmPromptSets)")  # fmt: skip
        router = [
            *me, "router", "--local", str(folder), "--admin-token-file", str(token_file),
            "--host", args.host, "--port", str(args.port), "--policy", args.policy,
            "--log-level", args.log_level, *(["--access-log"] if args.access_log else []),
        ]  # fmt: skip
        children.append(Child("router", _spawn(router)))
        _say(f"router         http://{args.host}:{args.port}  (OpenAI API at /v1, "
             f"GET /v1/router/status)")  # fmt: skip
        if args.prometheus:
            children.extend(_prometheus(args, folder))
        ready_said = False
        base = f"http://{args.host}:{args.port}"
        while not stopping:
            dead = next((c for c in children if c.process.poll() is not None), None)
            if dead is not None:
                _say(f"{dead.name} exited with {dead.process.returncode}; stopping the fleet")
                return 1
            if not ready_said and _fleet_ready(base, args.nodes, token):
                ready_said = True
                print(ready_block(base, args.nodes, _served_context(base)), flush=True)
            time.sleep(0.2)
        return 0
    finally:
        _stop(children)
        if not args.dir:
            shutil.rmtree(folder, ignore_errors=True)


def _daemon_groups(args: argparse.Namespace) -> list[tuple[int, int]]:
    """(first node number, daemons) per process: one each, or for simulated daemons
    --sim-per-process to a process."""
    per = args.sim_per_process if args.engine == "sim" else 1
    return [(first, min(per, args.nodes - first + 1)) for first in range(1, args.nodes + 1, per)]


CLAUDE_CODE_MIN_COMPACT_WINDOW = 100_000  # Claude Code 2.1 reads a smaller window as this
CLAUDE_CODE_ANSWER_RESERVE = 20_000  # kept out of its window for the answer, at most
QWEN_CODE_TIMEOUT_MS = 1_800_000  # its default 120 s is less than a cold CPU prefill


def claude_code_compaction(context: int, max_output_tokens: int | None = None) -> dict[str, str]:
    """What makes Claude Code compact its conversation at three quarters of `context`,
    before a daemon would refuse it: a model it does not know gets a 1M-token window,
    `CLAUDE_CODE_AUTO_COMPACT_WINDOW` takes no less than 100k, and
    `CLAUDE_AUTOCOMPACT_PCT_OVERRIDE` is a share of that window less what it keeps for
    its answer (20k, or its CLAUDE_CODE_MAX_OUTPUT_TOKENS when lower: measured)."""
    window = max(context, CLAUDE_CODE_MIN_COMPACT_WINDOW)
    effective = window - min(
        max_output_tokens or CLAUDE_CODE_ANSWER_RESERVE, CLAUDE_CODE_ANSWER_RESERVE
    )
    percent = max(1, context * 75 // effective)
    return {
        "CLAUDE_CODE_AUTO_COMPACT_WINDOW": str(window),
        "CLAUDE_AUTOCOMPACT_PCT_OVERRIDE": str(percent),
    }


def ready_block(base: str, nodes: int, context: int | None) -> str:
    """What `up` prints once the fleet serves: how to point each coding agent at it."""
    served = f", a {context:,}-token context" if context else ""
    codex_provider = (
        f'model_providers.warmfleet={{name="warmfleet", base_url="{base}/v1", '
        'wire_api="responses"}'
    )
    opencode = {
        "$schema": "https://opencode.ai/config.json",
        "provider": {
            "warmfleet": {
                "npm": "@ai-sdk/openai-compatible",
                "options": {"baseURL": f"{base}/v1"},
                "models": {"default": {}},
            }
        },
    }
    compaction_settings = claude_code_compaction(context) if context else {}
    compaction = "".join(f"{name}={value} " for name, value in compaction_settings.items())
    lines = [
        f"warmfleet up: ready: {nodes} daemon{'s' if nodes > 1 else ''} behind the router at "
        f"{base}{served} "
        "(Ctrl-C stops everything)",
        f"  OpenAI clients  OPENAI_BASE_URL={base}/v1 OPENAI_API_KEY=unused, model default",
        f"  Claude Code     ANTHROPIC_BASE_URL={base} ANTHROPIC_API_KEY=unused "
        "ANTHROPIC_MODEL=default ANTHROPIC_SMALL_FAST_MODEL=default "
        f"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 {compaction}claude",
        f"  Codex           codex -c model_provider=warmfleet -c '{codex_provider}' -m default",
        f"  Qwen Code       OPENAI_BASE_URL={base}/v1 OPENAI_API_KEY=unused OPENAI_MODEL=default "
        f"QWEN_CODE_API_TIMEOUT_MS={QWEN_CODE_TIMEOUT_MS} qwen --auth-type openai",
        f"  opencode        opencode.json: {json.dumps(opencode, separators=(',', ':'))}",
        "                  then: opencode run -m warmfleet/default PROMPT",
    ]
    return "\n".join(lines)


def _served_context(base: str) -> int | None:
    """The context the router's backends serve (their `max_model_len`), if they say."""
    try:
        models = httpx.get(f"{base}/v1/models", timeout=2).json()["data"]
        return int(models[0]["max_model_len"])
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError):
        return None


def _fleet_ready(base: str, nodes: int, token: str) -> bool:
    try:
        auth = {"Authorization": f"Bearer {token}"}  # the detail is the admin's
        body = httpx.get(f"{base}/v1/router/status", headers=auth, timeout=2).json()
    except (httpx.HTTPError, ValueError):
        return False
    ready = [b for b in body.get("backends", []) if b.get("health") == "ready"]
    return len(ready) == nodes


def _prometheus(args: argparse.Namespace, folder: Path) -> list[Child]:
    binary = shutil.which("prometheus")
    if binary is None:
        _say("prometheus     not installed (apt-get install prometheus); skipped")
        return []
    targets = [f"{args.host}:{args.port + i}" for i in range(args.nodes + 1)]
    config = {
        "global": {"scrape_interval": "5s"},
        "scrape_configs": [{"job_name": "warmfleet", "static_configs": [{"targets": targets}]}],
    }
    (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
    cmd = [
        binary,
        f"--config.file={folder / 'prometheus.yml'}",
        f"--storage.tsdb.path={folder / 'prometheus-data'}",
        f"--web.listen-address={args.host}:{args.prometheus_port}",
    ]
    _say(f"prometheus     http://{args.host}:{args.prometheus_port}  (scraping {len(targets)})")
    return [Child("prometheus", _spawn(cmd, quiet=True))]


def _spawn(cmd: list[str], quiet: bool = False) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        cmd,
        start_new_session=True,  # Ctrl-C reaches `up` only; it stops each child once
        stdout=subprocess.DEVNULL if quiet else None,
        stderr=subprocess.DEVNULL if quiet else None,
    )


def _stop(children: list[Child], timeout: float = 20.0) -> None:
    # The router first (no new requests), then the operator, then the daemons.
    for child in reversed(children):
        if child.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                child.process.send_signal(signal.SIGINT)
    deadline = time.monotonic() + timeout
    for child in reversed(children):
        try:
            child.process.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _say(f"{child.name} did not stop in {timeout:.0f}s; killing it")
            child.process.kill()
            child.process.wait()
    if children:
        _say("stopped")


def _say(line: str) -> None:
    print(f"warmfleet up: {line}", flush=True)


def _fail(message: str) -> int:
    print(f"warmfleet up: {message}", file=sys.stderr)
    return 2
