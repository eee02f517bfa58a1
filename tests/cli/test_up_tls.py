"""`warmfleet up --tls --api-keys-file FILE`: the whole local fleet over TLS from a
throwaway CA, with client keys: the router serves HTTPS and verifies the daemons, the
operator pushes to them with its client certificate (mTLS), the `openai` and `anthropic`
SDKs reach the router with the CA and a key (the second request hits the first's
blocks), and nothing answers without a key, a certificate or the CA."""

from __future__ import annotations

import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import httpx2
import openai
import pytest

from support.processes import free_port
from warmfleet_cli.up import port_free

ROOT = Path(__file__).resolve().parents[2]
KEY = "sk-team-a-0123456789abcdef"
SYSTEM = {"role": "system", "content": "You are Beacon, the release train's assistant. " * 8}


def three_free_ports() -> int:
    for _ in range(50):
        port = free_port()
        if port + 2 < 65536 and all(port_free("127.0.0.1", port + i) for i in range(3)):
            return port
    raise RuntimeError("no three consecutive free ports")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    folder = tmp_path_factory.mktemp("up-tls")
    (folder / "keys").write_text(f"team-a {KEY}\n")
    port = three_free_ports()
    log_path = folder / "up.log"
    with open(log_path, "wb") as log:
        up = subprocess.Popen(
            [
                sys.executable, "-m", "warmfleet_cli", "up", "--nodes", "2",
                "--model", "tiny-random", "--port", str(port), "--tls",
                "--api-keys-file", str(folder / "keys"), "--dir", str(folder / "fleet"),
                "--warm", str(ROOT / "examples" / "daemon" / "warm-prompts.yaml"),
            ],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        # The example set warm (not `up`'s learning set, ready with nothing learned).
        while "Ready=True AllWarm" not in log_path.read_text():
            assert up.poll() is None and time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.5)
        yield f"https://127.0.0.1:{port}", folder / "fleet"
    finally:
        up.send_signal(signal.SIGINT)
        try:
            up.wait(timeout=60)
        except subprocess.TimeoutExpired:
            up.kill()
            up.wait()
    assert "Traceback" not in log_path.read_text(), log_path.read_text()


def test_the_fleet_serves_over_tls_with_keys(fleet: tuple[str, Path]) -> None:
    router, folder = fleet
    ca = folder / "tls" / "ca.crt"
    verify = ssl.create_default_context(cafile=str(ca))
    http = httpx.Client(verify=verify)
    client = openai.OpenAI(base_url=f"{router}/v1", api_key=KEY, max_retries=0, http_client=http)
    messages = [SYSTEM, {"role": "user", "content": "Is the train on time?"}]
    cached = []
    for _ in range(2):
        r = client.chat.completions.create(model="default", messages=messages, max_tokens=3)  # type: ignore[arg-type]
        assert r.usage is not None and r.usage.prompt_tokens_details is not None
        cached.append(r.usage.prompt_tokens_details.cached_tokens or 0)
    assert cached[1] > 50
    # The anthropic SDK is on httpx2, which takes the same `verify`.
    claude = anthropic.Anthropic(
        base_url=router, api_key=KEY, max_retries=0, http_client=httpx2.Client(verify=verify)
    )
    assert claude.messages.create(model="default", max_tokens=2, messages=messages[1:]).role  # type: ignore[arg-type]
    # No key, no answer; no CA, no connection.
    assert httpx.get(f"{router}/v1/models", verify=verify).status_code == 401
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{router}/healthz")


def test_the_daemons_admin_routes_need_the_fleets_client_certificate(
    fleet: tuple[str, Path],
) -> None:
    router, folder = fleet
    token = (folder / "admin-token").read_text().strip()
    auth = {"Authorization": f"Bearer {token}"}
    ca = folder / "tls" / "ca.crt"
    verify = ssl.create_default_context(cafile=str(ca))
    deadline = time.monotonic() + 30
    while True:  # the router follows each daemon's cache events: an admin route, over mTLS
        status = httpx.get(f"{router}/v1/router/status", headers=auth, verify=verify)
        nodes = status.json()["backends"]
        if all(b["health"] == "ready" and b["index"]["mode"] == "following" for b in nodes):
            break
        assert time.monotonic() < deadline, [(b["index"], b["problems"]) for b in nodes]
        time.sleep(0.5)
    daemon = nodes[0]["url"]
    assert daemon.startswith("https://")
    anonymous = ssl.create_default_context(cafile=str(ca))
    r = httpx.get(f"{daemon}/v1/warm-sets", headers=auth, verify=anonymous)
    assert r.status_code == 403
    mutual = ssl.create_default_context(cafile=str(ca))
    mutual.load_cert_chain(str(folder / "tls" / "tls.crt"), str(folder / "tls" / "tls.key"))
    sets = httpx.get(f"{daemon}/v1/warm-sets", headers=auth, verify=mutual).json()["sets"]
    assert sets and all(s["warm"] == s["total"] for s in sets)  # the operator pushed them
