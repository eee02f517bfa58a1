"""Issue 36's opt-in target with the real agent CLIs: `warmfleet up --nodes 2` on the
embedded model learns Claude Code's and Codex's static heads from their traffic, with
no capture and no kubectl (opt-in: `pytest --e2e`, with WARMFLEET_AGENTS_DIR as in
test_agent_clis.py; skipped when a CLI is not there).

For each CLI, through the router: three sessions (each a new process, so its own
session id: Claude Code's session header and `metadata.user_id`, Codex's
`prompt_cache_key`) from the same HOME and project directory; the router learns their
shared head (K = 3), the local operator's `learned` WarmPromptSet takes it and warms it
on both daemons (its status file says Ready with the prompt warm on 2/2 nodes, and each
daemon's warm set holds it warm). Then a fourth session's first request must be routed
to the node that served none of the three and read >= 90% of the head from cache.

Once both nodes hold the head, the `prefix` policy sees equal savings (within a fifth)
and breaks the tie by load, then by tokens cached in RAM: the node that served the
three also holds the start of their first user message (Claude Code's attribution
reminder), a block more than the head, so an idle fleet sends every new session there
(seen: the fourth and fifth sessions of a run both went to it). The fourth session
therefore starts while that node is busy with another request through the router (a
long uncached prompt whose session key hashes to it), as in a fleet under load: load
then decides, and the new session lands on the node that only the learned set warmed.
(If both nodes served some of the three, it runs unforced and must read >= 90% of the
head wherever it lands.) The node and the cached and prompt tokens of each first
request are read from the router's recent decisions (`GET /v1/router/status`).

Slow: each CLI's first session prefills its whole first request cold (Claude Code's is
~12.7k tokens, Codex's ~9.1k) and the idle node warms the learned head cold too.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from support.agent_clis import CLAUDE, CODEX, PINNED, claude, codex, needs, version
from support.processes import free_port, interrupt
from warmfleet_cli.local_fleet import port_free
from warmfleet_router.policy import rendezvous

MODEL = "SmolLM2-135M-Instruct"  # the served name: Claude Code reads "default" as its own alias
CONTEXT = 32768  # Claude Code's first request is ~12.7k tokens, Codex's ~9.1k
MAX_OUTPUT = 32  # CLAUDE_CODE_MAX_OUTPUT_TOKENS and the daemons' ceiling: turns are prefill
START_TIMEOUT = 600
LEARN_TIMEOUT = 1800  # the idle node's cold warm-up of the head on two loaded cores
TURN_TIMEOUT = 1800  # a cold prefill of a whole request, at worst
PROMPTS = [
    "What is in this project?",
    "Summarise the README in one line.",
    "Which file should I read first?",
    "Is there anything to fix here?",
    "Name one file here.",
    "What language is this project in?",
    "Who would use this project?",
    "Say what the README is about.",
]
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(START_TIMEOUT + 2 * (LEARN_TIMEOUT + 12 * 600))]


@dataclass
class First:
    """A session's first request, as the router decided and settled it."""

    backend: str
    cached: int
    prompt: int


@dataclass
class Fleet:
    url: str
    daemons: dict[str, str]  # backend name -> URL
    token: str
    folder: Path
    log: Path
    proc: subprocess.Popen[bytes]

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def decisions(self) -> list[dict[str, Any]]:
        """The router's recent decisions, oldest first."""
        answer = httpx.get(f"{self.url}/v1/router/status", headers=self.auth, timeout=30)
        return list(reversed(answer.json()["decisions"]))

    def learned(self) -> list[dict[str, Any]]:
        answer = httpx.get(f"{self.url}/v1/router/learned", headers=self.auth, timeout=30)
        return list(answer.json()["data"])

    def status(self) -> dict[str, Any]:
        """The local operator's status of the `learned` set (empty before it writes one)."""
        files = list(self.folder.rglob("warmfleet-status.json"))
        if not files:
            return {}
        try:
            sets = json.loads(files[0].read_text())["warmPromptSets"]
        except (ValueError, KeyError):
            return {}
        return dict(sets.get("default/learned") or {})

    def held(self, name: str) -> dict[str, int]:
        """Each daemon's warmed tokens of the learned prompt `name` (daemons holding it
        warm only)."""
        tokens = {}
        for backend, url in self.daemons.items():
            try:
                got = httpx.get(f"{url}/v1/warm-sets/default/learned", headers=self.auth)
                prompts = got.json().get("prompts", []) if got.status_code == 200 else []
            except (httpx.HTTPError, ValueError):
                prompts = []
            for p in prompts:
                if p["name"] == name and p["state"] == "warm":
                    tokens[backend] = int(p["tokens"])
        return tokens

    def tail(self) -> str:
        return self.log.read_text()[-6000:]


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """HOME and the project directory every session runs in (Claude Code names its
    memory directory, under both, in its system prompt)."""
    root = tmp_path_factory.mktemp("learned")
    home, work = root / "home", root / "project"
    home.mkdir()
    work.mkdir()
    (work / "README.md").write_text("# demo\nA project the agents are asked about.\n")
    return home, work


@pytest.fixture(scope="module")
def fleet(project: tuple[Path, Path]) -> Iterator[Fleet]:
    """`warmfleet up --nodes 2` on the embedded model, learning from 3 sessions, with
    nothing captured: its `learned` set is Ready with nothing learned."""
    root = project[0].parent
    folder, log = root / "fleet", root / "up.log"
    port = free_port()
    while not all(_free(port + i) for i in range(3)):
        port = free_port()
    command = [
        sys.executable, "-m", "warmfleet_cli", "up", "--nodes", "2", "--model", "default",
        "--max-context", str(CONTEXT), "--port", str(port), "--dir", str(folder),
        "--max-output-tokens", str(MAX_OUTPUT), "--learn-min-sessions", "3",
    ]  # fmt: skip
    with log.open("w") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while not (folder / "admin-token").exists():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        token = (folder / "admin-token").read_text().strip()
        url = f"http://127.0.0.1:{port}"
        fleet = Fleet(url, {}, token, folder, log, proc)

        def up() -> bool:
            try:
                answer = httpx.get(f"{url}/v1/router/status", headers=fleet.auth, timeout=10)
                backends = answer.json()["backends"] if answer.status_code == 200 else []
            except (httpx.HTTPError, ValueError):
                return False
            fleet.daemons = {b["name"]: b["url"] for b in backends}
            ready = fleet.status()
            condition = [c for c in ready.get("conditions", []) if c["type"] == "Ready"]
            return len(backends) == 2 and bool(condition) and condition[0]["status"] == "True"

        wait(fleet, up, START_TIMEOUT, "the fleet up, its learned set Ready")
        yield fleet
    finally:
        interrupt(proc, timeout=60)


def _free(port: int) -> bool:
    return port_free("127.0.0.1", port)


def wait(fleet: Fleet, done: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        assert fleet.proc.poll() is None, fleet.tail()
        result = done()
        if result:
            return result
        assert time.monotonic() < deadline, f"{what}: not within {timeout}s\n{fleet.tail()}"
        time.sleep(5)


def first_request(fleet: Fleet, before: list[dict[str, Any]], since: float = 0.0) -> First:
    """The first request the router decided since `before` that arrived at `since` (wall
    clock) or later (one session ran since; `busy`'s request arrived before it)."""
    seen = {(d["time"], d["session"]) for d in before}
    new = [
        d
        for d in fleet.decisions()
        if (d["time"], d["session"]) not in seen and d["arrived"] >= since
    ]
    assert new, "the session sent nothing through the router"
    first = min(new, key=lambda d: d["arrived"])
    return First(first["backend"], int(first["cached_tokens"]), int(first["prompt_tokens"]))


def learn_and_land(
    fleet: Fleet,
    client: str,
    session: Callable[[str], None],
    record: Callable[[str, object], None],
) -> tuple[First, int]:
    """Three sessions of `client`, the learned head warm on both nodes, then new sessions
    until one's first request lands on the node that served none of the three (or, if
    both served some, the fourth): that first request and the head's warmed tokens."""
    served: list[First] = []
    for i in range(3):
        before, started = fleet.decisions(), time.monotonic()
        session(PROMPTS[i])
        served.append(first_request(fleet, before))
        record(
            f"e2e timing: {client} session {i + 1}",
            f"{time.monotonic() - started:.0f}s, {served[-1]}",
        )

    def learned() -> dict[str, Any] | None:
        mine = [p for p in fleet.learned() if p["client"] == client]
        return mine[0] if mine else None

    try:
        prompt = wait(fleet, learned, 60, f"the router learning {client}'s head")
    except AssertionError:
        answer = httpx.get(f"{fleet.url}/v1/router/status", headers=fleet.auth, timeout=30)
        raise AssertionError(
            f"{client}: nothing learned from 3 sessions (its heads differ?): "
            f"{json.dumps(fleet.learned())[:2000]} {answer.text[:3000]}"
        ) from None
    assert prompt["sessions"] == 3, prompt
    name, started = prompt["name"], time.monotonic()

    def warm_everywhere() -> dict[str, int] | None:
        state = fleet.status()
        names = [e["name"] for e in state.get("learned", [])]
        ready = [c for c in state.get("conditions", []) if c["type"] == "Ready"]
        if name not in names or state.get("warmNodes") != "2/2" or not ready:
            return None
        if ready[0]["status"] != "True":
            return None
        held = fleet.held(name)
        return held if len(held) == 2 else None

    held = wait(fleet, warm_everywhere, LEARN_TIMEOUT, f"{name} warm on both nodes")
    assert len(set(held.values())) == 1, held  # the same head on both
    (head,) = set(held.values())
    record(
        f"e2e timing: {client} learned head warm on both",
        f"{time.monotonic() - started:.0f}s, {head} tokens",
    )

    nodes = {f.backend for f in served}
    idle = set(fleet.daemons) - nodes
    before, started, since = fleet.decisions(), time.monotonic(), time.time()
    if idle:  # the three's node busy, so the router's tie between two warm nodes is load
        (node,) = nodes
        with busy(fleet, node):
            since = time.time()  # the busy request arrived before: not the session's
            session(PROMPTS[3])
    else:
        session(PROMPTS[3])
    first = first_request(fleet, before, since)
    record(
        f"e2e timing: {client} session 4",
        f"{time.monotonic() - started:.0f}s, {first} (head {head}, the three on {sorted(nodes)})",
    )
    assert not idle or first.backend in idle, (first, idle)
    assert first.cached >= 0.9 * head, (first, head)
    return first, head


@contextmanager
def busy(fleet: Fleet, node: str) -> Iterator[None]:
    """A request through the router in flight on `node` (a long prompt nothing caches: a
    fresh one each time, since the daemons keep the last one's blocks; with a session key
    whose hash, the router's last tie-break, picks `node`)."""
    (other,) = set(fleet.daemons) - {node}
    key = next(k for k in (f"busy-{i}" for i in range(64)) if _prefers(k, node, other))
    words = f"Count the words ({uuid.uuid4().hex}): " + "lorem ipsum " * 1500  # cached nowhere
    body = {"model": MODEL, "messages": [{"role": "user", "content": words}], "max_tokens": 8}
    headers = {**fleet.auth, "x-session-affinity": key}
    done: list[httpx.Response | BaseException] = []

    def send() -> None:
        try:
            url = f"{fleet.url}/v1/chat/completions"
            done.append(httpx.post(url, json=body, headers=headers, timeout=TURN_TIMEOUT))
        except BaseException as error:  # reported by the caller
            done.append(error)

    thread = threading.Thread(target=send, daemon=True)
    thread.start()

    def in_flight() -> bool:
        answer = httpx.get(f"{fleet.url}/v1/router/status", headers=fleet.auth, timeout=30)
        loads = {b["name"]: b["in_flight"] for b in answer.json()["backends"]}
        assert not done, done
        assert loads[other] == 0, loads  # nothing else runs: the router picked `node`
        return bool(loads[node] >= 1)

    wait(fleet, in_flight, 60, f"a request in flight on {node}")
    yield
    thread.join(TURN_TIMEOUT)
    assert done and isinstance(done[0], httpx.Response) and done[0].status_code == 200, done


def _prefers(key: str, node: str, other: str) -> bool:
    return rendezvous(key.encode(), node) > rendezvous(key.encode(), other)


@needs(CLAUDE)
def test_claude_code_head_is_learned_and_a_new_session_starts_warm_on_the_other_node(
    fleet: Fleet, project: tuple[Path, Path], record_property: Any
) -> None:
    home, work = project
    record_property("e2e version: claude", f"{version(CLAUDE)} (written for {PINNED['claude']})")

    def session(prompt: str) -> None:
        run = claude(
            home, fleet.url, prompt, model=MODEL, cwd=work, max_output_tokens=MAX_OUTPUT,
            timeout=TURN_TIMEOUT, check=False,  # the tiny model may not stop within the limit
        )  # fmt: skip
        result = run.result
        cut = result.get("api_error") == "max_output_tokens"
        assert (not result["is_error"] or cut) and result.get("api_error_status") is None, result

    first, head = learn_and_land(fleet, "claude-code", session, record_property)
    record_property("e2e claude-code first request", f"{first}, head {head}")
    assert head > 8000


@needs(CODEX)
def test_codex_head_is_learned_and_a_new_session_starts_warm_on_the_other_node(
    fleet: Fleet, project: tuple[Path, Path], record_property: Any
) -> None:
    home, work = project
    record_property("e2e version: codex", f"{version(CODEX)} (written for {PINNED['codex']})")

    def session(prompt: str) -> None:
        run = codex(
            home, fleet.url, prompt, model=MODEL, cwd=work, timeout=TURN_TIMEOUT, check=False
        )
        cut = "ran out of room in the model's context window"
        assert all(cut in e for e in run.errors()), run.events
        assert run.code == (1 if run.errors() else 0), run.stderr

    first, head = learn_and_land(fleet, "codex", session, record_property)
    record_property("e2e codex first request", f"{first}, head {head}")
    assert head > 5000
