"""`warmfleet warm-prompts capture` against the real agent CLIs, then the captured warm
prompt against the agents' next session (opt-in: `pytest --e2e`, with
WARMFLEET_AGENTS_DIR naming a directory where `npm install @anthropic-ai/claude-code
@openai/codex` was run; skipped when a CLI is not there).

Each CLI runs headless and offline, as a user would: pointed at the capture endpoint it
ends its session cleanly with the capture's short reply; then, pointed at a daemon that
warmed the captured file (a scripted model, so the reply is short and ends: the prefill,
the prefix cache and the APIs are the real ones), its first request of another session
(another prompt) reports the whole warm prompt as cached.
"""

from __future__ import annotations

import json
import ssl
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml

from support.agent_clis import CLAUDE, CODEX, capturing, claude, codex, finish, needs
from support.engine import model
from support.processes import serving
from support.scripted import NAME, ScriptedModel
from warmfleet_cli.local_ca import CertFiles, make_local_ca
from warmfleet_common.tls import TlsOptions
from warmfleet_daemon.api.app import create_app
from warmfleet_daemon.engine.core import Engine
from warmfleet_daemon.engine.requests import EngineConfig
from warmfleet_daemon.models.loader import LoadedModel
from warmfleet_daemon.settings import DaemonSettings

pytestmark = pytest.mark.e2e
ANSWER = "Hello from the warm fleet."
TIMEOUT = 300
KEY = "sk-agents-team-a-" + uuid.uuid4().hex
ADMIN = "agents-admin-" + uuid.uuid4().hex


@contextmanager
def warm_daemon(
    warm_prompts: Path, shared: SharedFleet | None = None
) -> Iterator[tuple[str, dict[str, int]]]:
    """A daemon (scripted model, a context the agents' ~13k-token requests fit in) that
    warms `warm_prompts`; yields its URL and each prompt's warmed tokens. With `shared`:
    over HTTPS from its CA, with its keys file and admin token."""
    tokenizer = model("tiny-random").tokenizer
    scripted = ScriptedModel(tokenizer, ANSWER)
    loaded = LoadedModel(scripted, tokenizer, NAME, "a script", 32768, False)  # type: ignore[arg-type]
    engine = Engine(loaded, EngineConfig(block_size=32, cache_budget_bytes=1 << 28))
    settings = DaemonSettings(
        model=NAME,
        default_temperature=0.0,
        warm_prompts=str(warm_prompts),
        api_keys_file=str(shared.keys) if shared else None,
        admin_token=ADMIN if shared else None,
    )
    tls = TlsOptions(str(shared.certs.cert), str(shared.certs.key)) if shared else None
    verify: ssl.SSLContext | bool = shared.verify() if shared else True
    admin = {"Authorization": f"Bearer {ADMIN}"} if shared else {}
    with serving(create_app(settings, engine=engine), tls=tls) as url:
        deadline = time.monotonic() + TIMEOUT
        while httpx.get(f"{url}/readyz", params={"warm": 1}, verify=verify).status_code != 200:
            sets = httpx.get(f"{url}/v1/warm-sets", headers=admin, verify=verify).text
            assert time.monotonic() < deadline, sets
            time.sleep(0.2)
        sets = httpx.get(f"{url}/v1/warm-sets", headers=admin, verify=verify).json()["sets"]
        yield url, {p["name"]: p["tokens"] for s in sets for p in s["prompts"]}


@dataclass
class SharedFleet:
    """A shared fleet's files: a throwaway CA and the certificate it signed, a keys file."""

    certs: CertFiles
    keys: Path

    def verify(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.certs.ca))


@pytest.fixture
def shared(tmp_path: Path) -> SharedFleet:
    keys = tmp_path / "api-keys"
    keys.write_text(f"team-a {KEY}\n")
    return SharedFleet(make_local_ca(tmp_path / "tls"), keys)


@needs(CLAUDE)
def test_claude_code_is_captured_and_its_next_session_starts_warm(tmp_path: Path) -> None:
    home, out = tmp_path / "home", tmp_path / "agents.yaml"
    home.mkdir()
    with capturing(out) as (url, proc):
        result = claude(home, url, "say hi", model=NAME).result
        assert result["is_error"] is False and "captured" in result["result"]
        wps = finish(proc)
    (entry,) = yaml.safe_load(out.read_text())
    assert entry["name"] == "claude-code" and wps["spec"]["prompts"] == [entry]
    assert len(entry["anthropic"]["tools"]) >= 5 and "billing" not in entry["anthropic"]["system"]

    with warm_daemon(out) as (url, tokens):
        result = claude(home, url, "What files are here?", model=NAME).result
    assert result["is_error"] is False and result["result"] == ANSWER
    assert result["num_turns"] == 1
    assert result["usage"]["cache_read_input_tokens"] == tokens["claude-code"] > 5000


@needs(CODEX)
def test_codex_is_captured_and_its_next_session_starts_warm(tmp_path: Path) -> None:
    home, out = tmp_path / "home", tmp_path / "agents.json"
    home.mkdir()
    with capturing(out) as (url, proc):
        said = codex(home, url, "say hi", model=NAME).said()
        assert len(said) == 1 and "captured" in said[0]
        finish(proc)
    (entry,) = json.loads(out.read_text())
    assert entry["name"] == "codex" and entry["responses"]["input"][0]["role"] == "developer"

    with warm_daemon(out) as (url, tokens):
        run = codex(home, url, "What files are here?", model=NAME)
    assert run.said() == [ANSWER]
    assert run.usage()["cached_input_tokens"] == tokens["codex"] > 5000


@needs(CLAUDE)
def test_claude_code_over_tls_with_a_client_key(tmp_path: Path, shared: SharedFleet) -> None:
    """A shared fleet as issue 37 runs it: Claude Code trusts the fleet's CA
    (NODE_EXTRA_CA_CERTS), sends its key (ANTHROPIC_API_KEY, as x-api-key) and starts
    warm; with a wrong key it gets the 401 and says so."""
    home, out = tmp_path / "home", tmp_path / "agents.yaml"
    home.mkdir()
    with capturing(out) as (url, proc):
        assert claude(home, url, "say hi", model=NAME).result["is_error"] is False
        finish(proc)
    trusted = {"NODE_EXTRA_CA_CERTS": str(shared.certs.ca)}
    with warm_daemon(out, shared) as (url, tokens):
        assert url.startswith("https://")
        env = trusted | {"ANTHROPIC_API_KEY": KEY}
        result = claude(home, url, "What files are here?", model=NAME, env=env).result
        assert result["is_error"] is False and result["result"] == ANSWER
        assert result["usage"]["cache_read_input_tokens"] == tokens["claude-code"] > 5000
        wrong = trusted | {"ANTHROPIC_API_KEY": "sk-not-a-key-0123456789"}
        refused = claude(home, url, "Hi?", model=NAME, env=wrong, check=False).result
        assert refused["is_error"] is True and "401" in json.dumps(refused)


@needs(CODEX)
def test_codex_over_tls_with_a_client_key(tmp_path: Path, shared: SharedFleet) -> None:
    """Codex trusts the fleet's CA (CODEX_CA_CERTIFICATE), sends its key as a Bearer
    token (the provider's env_key) and starts warm; with a wrong key its turn fails."""
    home, out = tmp_path / "home", tmp_path / "agents.json"
    home.mkdir()
    with capturing(out) as (url, proc):
        codex(home, url, "say hi", model=NAME)
        finish(proc)
    trusted = {"CODEX_CA_CERTIFICATE": str(shared.certs.ca)}
    with warm_daemon(out, shared) as (url, tokens):
        env = trusted | {"WARMFLEET_API_KEY": KEY}
        run = codex(home, url, "What files are here?", model=NAME, env=env)
        assert run.said() == [ANSWER]
        assert run.usage()["cached_input_tokens"] == tokens["codex"] > 5000
        wrong = trusted | {"WARMFLEET_API_KEY": "sk-not-a-key-0123456789"}
        refused = codex(home, url, "Hi?", model=NAME, env=wrong, check=False, timeout=120)
        assert refused.code != 0 and refused.errors(), refused.stderr
