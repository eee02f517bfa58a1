"""`warmfleet up`'s ready block, the lines it prints once the fleet serves, read as a
user reads them: how many daemons, the context they serve, a Claude Code command line
whose compaction settings fit that context, an opencode.json that parses, and with
client keys and TLS, the key and CA each agent is given (the five-minute `make run`
test reads it too, whole, on a live fleet)."""

from __future__ import annotations

import json
import shlex
from typing import Any

import pytest

from warmfleet_cli.up import ready_block

BASE = "http://127.0.0.1:8000"


def line(block: str, label: str) -> str:
    """The line of `block` for one client (its label at the start, indented)."""
    (found,) = [row for row in block.splitlines() if row.startswith(f"  {label} ")]
    return found.removeprefix(f"  {label} ").strip()


def opencode_config(block: str) -> dict[str, Any]:
    text = line(block, "opencode").removeprefix("opencode.json:").strip()
    config = json.loads(text)
    assert isinstance(config, dict)
    return config


def claude_env(block: str) -> dict[str, str]:
    """The environment Claude Code's command line sets, and that it runs `claude`."""
    words = shlex.split(line(block, "Claude Code"))
    assert words[-1] == "claude"
    return dict(word.split("=", 1) for word in words[:-1])


def test_one_node_and_no_context_known() -> None:
    block = ready_block(BASE, 1, None)
    first = block.splitlines()[0]
    assert first.startswith(f"warmfleet up: ready: 1 daemon behind the router at {BASE} ")
    assert "daemons" not in first and "-token context" not in first
    env = claude_env(block)
    assert env["ANTHROPIC_BASE_URL"] == BASE and env["ANTHROPIC_MODEL"] == "default"
    # No context known: Claude Code is not told when to compact.
    assert not any(name.startswith(("CLAUDE_CODE_AUTO", "CLAUDE_AUTOCOMPACT")) for name in env)
    assert not any(row.startswith("  TLS ") for row in block.splitlines())
    assert "=KEY" not in block and "WARMFLEET_API_KEY" not in block


def test_a_32k_context_sets_claude_codes_compaction_before_the_daemon_refuses() -> None:
    context = 32_768
    block = ready_block(BASE, 3, context)
    assert block.splitlines()[0].startswith(
        f"warmfleet up: ready: 3 daemons behind the router at {BASE}, a 32,768-token context "
    )
    env = claude_env(block)
    # Claude Code reads a window below 100k as 100k and keeps 20k of it for its answer:
    # 30 % of the 80k left is 24,000 tokens, under three quarters of the context.
    assert env["CLAUDE_CODE_AUTO_COMPACT_WINDOW"] == "100000"
    assert env["CLAUDE_AUTOCOMPACT_PCT_OVERRIDE"] == "30"
    compacts_at = (100_000 - 20_000) * 30 // 100
    assert compacts_at <= context * 3 // 4
    assert env["ANTHROPIC_API_KEY"] == "unused"


@pytest.mark.parametrize("keys", [None, "/etc/warmfleet/keys"])
def test_the_opencode_json_parses_and_points_at_the_router(keys: str | None) -> None:
    config = opencode_config(ready_block(BASE, 2, 32_768, keys=keys))
    assert config["$schema"] == "https://opencode.ai/config.json"
    provider = config["provider"]["warmfleet"]
    assert provider["npm"] == "@ai-sdk/openai-compatible"
    assert provider["models"] == {"default": {}}
    expected = {"baseURL": f"{BASE}/v1"}
    if keys:
        expected["apiKey"] = "{env:WARMFLEET_API_KEY}"
    assert provider["options"] == expected


def test_client_keys_and_tls_are_given_to_every_agent() -> None:
    ca, keys = "/var/lib/warmfleet/ca.pem", "/etc/warmfleet/keys"
    block = ready_block(BASE, 1, 8_192, ca=ca, keys=keys)
    assert block.splitlines()[0].endswith(f"; KEY: one of {keys}")
    assert "unused" not in block  # every agent is given a key of the file
    assert claude_env(block)["ANTHROPIC_API_KEY"] == "KEY"
    assert line(block, "Codex").startswith("WARMFLEET_API_KEY=KEY codex ")
    assert 'env_key="WARMFLEET_API_KEY"' in line(block, "Codex")
    tls = line(block, "TLS")
    assert f"SSL_CERT_FILE={ca}" in tls and f"NODE_EXTRA_CA_CERTS={ca}" in tls
