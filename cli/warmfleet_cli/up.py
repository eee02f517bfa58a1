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
import json
import secrets
import shutil
import signal
import ssl
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import yaml
from pydantic import ValidationError

from warmfleet_cli.local_fleet import (
    Child,
    FleetOptions,
    LocalFleet,
    port_free,
    spawn_quiet,
)
from warmfleet_common.contract import WarmPrompt
from warmfleet_common.crd import API_VERSION, FLEET_LABEL
from warmfleet_router.policy import POLICIES


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
        "--tls",
        action="store_true",
        help="every hop over TLS: a throwaway CA in the fleet's folder (tls/ca.crt) signs one "
        "certificate every component serves and presents (mTLS on the daemons' admin and "
        "peer routes)",
    )
    p.add_argument(
        "--api-keys-file",
        metavar="FILE",
        help="client keys (`TENANT KEY` lines) for the router and every daemon: each tenant's "
        "cache is its own",
    )
    p.add_argument("--quotas", metavar="FILE", help="the router's limits per tenant (YAML)")
    p.add_argument(
        "--learn-min-sessions",
        type=int,
        default=3,
        metavar="K",
        help="the router learns a warm prompt from a static head K distinct sessions sent, "
        "and the operator's `learned` WarmPromptSet warms it on every node (with "
        "--api-keys-file, a `learned-TENANT` set per tenant the file names at start, warm for "
        "that tenant only); 0: off",
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


def options_of(args: argparse.Namespace) -> FleetOptions:
    return FleetOptions(
        nodes=args.nodes,
        engine=args.engine,
        model=args.model,
        profile=args.profile,
        sim_speed=args.sim_speed,
        sim_per_process=args.sim_per_process,
        host=args.host,
        port=args.port,
        policy=args.policy,
        cache_memory_mb=args.cache_memory_mb,
        block_size=args.block_size,
        max_context=args.max_context,
        max_output_tokens=args.max_output_tokens,
        state_dir=args.state_dir,
        log_level=args.log_level,
        access_log=args.access_log,
        tls=args.tls,
        api_keys_file=str(Path(args.api_keys_file).absolute()) if args.api_keys_file else None,
        quotas_file=str(Path(args.quotas).absolute()) if args.quotas else None,
        learn_min_sessions=args.learn_min_sessions,
    )


def run(args: argparse.Namespace) -> int:
    options = options_of(args)
    problem = options.problem()
    if problem:
        return _fail(problem)
    ports = [args.port + i for i in range(args.nodes + 1)]
    busy = [p for p in ports if not port_free(args.host, p)]
    if busy:
        return _fail(f"port(s) {', '.join(map(str, busy))} on {args.host} are in use")
    folder = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="warmfleet-up-"))
    try:
        warm = warm_documents(Path(args.warm)) if args.warm else []
    except (OSError, ValueError, yaml.YAMLError) as exc:
        return _fail(f"--warm {args.warm}: {exc}")
    fleet = LocalFleet(options, folder, secrets.token_urlsafe(24), warm, _say)
    stopping = False

    def on_signal(signum: int, _: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        fleet.start()
        if args.prometheus:
            fleet.children.extend(_prometheus(args, folder))
        ready_said = False
        while not stopping:
            dead = fleet.dead()
            if dead is not None:
                _say(f"{dead.name} exited with {dead.process.returncode}; stopping the fleet")
                return 1
            if not ready_said and fleet.ready():
                ready_said = True
                base = fleet.router_url
                context = _served_context(base, fleet.verify, _a_key(options.api_keys_file))
                ca = str(fleet.certs.ca) if fleet.certs else None
                keys = options.api_keys_file
                print(ready_block(base, args.nodes, context, ca=ca, keys=keys), flush=True)
            time.sleep(0.2)
        return 0
    finally:
        fleet.stop()
        if not args.dir:
            shutil.rmtree(folder, ignore_errors=True)


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


def ready_block(
    base: str, nodes: int, context: int | None, *, ca: str | None = None, keys: str | None = None
) -> str:
    """What `up` prints once the fleet serves: how to point each coding agent at it (with
    `ca`, the CA its clients trust; with `keys`, a key of that file in place of `unused`)."""
    served = f", a {context:,}-token context" if context else ""
    # With client keys, Codex and opencode read the key from WARMFLEET_API_KEY.
    env_key = ', env_key="WARMFLEET_API_KEY"' if keys else ""
    codex_provider = (
        f'model_providers.warmfleet={{name="warmfleet", base_url="{base}/v1", '
        f'wire_api="responses"{env_key}}}'
    )
    opencode_options: dict[str, str] = {"baseURL": f"{base}/v1"}
    if keys:
        opencode_options["apiKey"] = "{env:WARMFLEET_API_KEY}"
    opencode = {
        "$schema": "https://opencode.ai/config.json",
        "provider": {
            "warmfleet": {
                "npm": "@ai-sdk/openai-compatible",
                "options": opencode_options,
                "models": {"default": {}},
            }
        },
    }
    compaction_settings = claude_code_compaction(context) if context else {}
    compaction = "".join(f"{name}={value} " for name, value in compaction_settings.items())
    key = "KEY" if keys else "unused"  # a key from the keys file: not printed
    lines = [
        f"warmfleet up: ready: {nodes} daemon{'s' if nodes > 1 else ''} behind the router at "
        f"{base}{served} "
        "(Ctrl-C stops everything)" + (f"; KEY: one of {keys}" if keys else ""),
        f"  OpenAI clients  OPENAI_BASE_URL={base}/v1 OPENAI_API_KEY={key}, model default",
        f"  Claude Code     ANTHROPIC_BASE_URL={base} ANTHROPIC_API_KEY={key} "
        "ANTHROPIC_MODEL=default ANTHROPIC_SMALL_FAST_MODEL=default "
        f"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 {compaction}claude",
        f"  Codex           {'WARMFLEET_API_KEY=KEY ' if keys else ''}codex -c "
        f"model_provider=warmfleet -c '{codex_provider}' -m default",
        f"  Qwen Code       OPENAI_BASE_URL={base}/v1 OPENAI_API_KEY={key} OPENAI_MODEL=default "
        f"QWEN_CODE_API_TIMEOUT_MS={QWEN_CODE_TIMEOUT_MS} qwen --auth-type openai",
        f"  opencode        opencode.json: {json.dumps(opencode, separators=(',', ':'))}",
        f"                  then: {'WARMFLEET_API_KEY=KEY ' if keys else ''}opencode run -m "
        "warmfleet/default PROMPT",
    ]
    if ca is not None:
        lines.append(
            f"  TLS             the fleet's CA is {ca}: SSL_CERT_FILE={ca} (Python clients, "
            f"curl --cacert {ca}), NODE_EXTRA_CA_CERTS={ca} (Node.js agents: Claude Code, "
            "opencode, Qwen Code)"
        )
    return "\n".join(lines)


def _served_context(
    base: str, verify: ssl.SSLContext | bool = True, key: str | None = None
) -> int | None:
    """The context the router's backends serve (their `max_model_len`), if they say."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        answer = httpx.get(f"{base}/v1/models", timeout=2, verify=verify, headers=headers)
        models = answer.json()["data"]
        return int(models[0]["max_model_len"])
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError):
        return None


def _a_key(path: str | None) -> str | None:
    """A raw key of the keys file (to read the served context with), if it holds one."""
    if not path:
        return None
    for line in Path(path).read_text().splitlines():
        parts = line.split()
        if len(parts) == 2 and not line.lstrip().startswith("#") and ":" not in parts[1]:
            return parts[1]
    return None


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
    return [Child("prometheus", spawn_quiet(cmd))]


def _say(line: str) -> None:
    print(f"warmfleet up: {line}", flush=True)


def _fail(message: str) -> int:
    print(f"warmfleet up: {message}", file=sys.stderr)
    return 2
