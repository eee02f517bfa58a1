"""A whole fleet on one machine, as child processes: N daemons on consecutive ports after
the router's, the operator in local mode on a folder of WarmNode, Secret and
WarmPromptSet YAML written for them, and the router. `warmfleet up` runs one for a
person; `warmfleet sim run` runs one for a replay and changes it as the trace says
(a node lost, nodes added, a rolling restart).

Each component is a child in its own process group, so one Ctrl-C reaches the parent
alone and it stops each child exactly once (a second SIGINT would make uvicorn skip its
shutdown). Simulated daemons run many to a process; with `node_control` their processes
take `kill I`, `stop I` and `start I` on stdin (`serve --node-control stdin`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from warmfleet_cli.local_ca import CertFiles, make_local_ca
from warmfleet_common.client_keys import KeysFile
from warmfleet_common.crd import API_VERSION, FLEET_LABEL, POOL_LABEL

TOKEN_SECRET = "warmfleet-daemon-token"
MAX_NODES = {"mlx": 64, "sim": 256}


@dataclass(frozen=True)
class FleetOptions:
    """What `warmfleet up` takes, less what only a person at a terminal needs."""

    nodes: int = 2
    engine: str = "mlx"  # mlx | sim
    model: str = "default"
    profile: str | None = None
    sim_speed: float | None = None
    sim_per_process: int = 50
    host: str = "127.0.0.1"
    port: int = 8000
    policy: str = "prefix"
    cache_memory_mb: int | None = None
    block_size: int | None = None
    max_context: int | None = None
    max_output_tokens: int | None = None
    state_dir: str | None = None
    log_level: str = "warning"
    access_log: bool = False
    node_control: bool = False  # simulated daemons take node commands on stdin
    operator_resync_s: float = 5.0
    drain_seconds: float | None = None  # each daemon's drain on a SIGTERM or `stop I`
    output_to_stderr: bool = False  # the components' output (stdout is the caller's own)
    max_num_seqs: int | None = None  # each daemon's (the serve default otherwise)
    tls: bool = False  # every hop over TLS, from a throwaway CA in the folder (`local_ca`)
    api_keys_file: str | None = None  # client keys, for the router and every daemon
    quotas_file: str | None = None  # the router's per-tenant limits
    # The router learns warm prompts from K sessions (0: off); the operator's `learned`
    # WarmPromptSet carries the fleet-wide ones to every node.
    learn_min_sessions: int = 3

    def problem(self) -> str | None:
        """Why these options cannot start a fleet, or None."""
        limit = MAX_NODES[self.engine]
        if self.learn_min_sessions < 0:
            return "--learn-min-sessions must be >= 0"
        if not 1 <= self.nodes <= limit:
            return f"--nodes must be between 1 and {limit} (--engine {self.engine})"
        if self.engine == "sim" and not self.profile:
            return "--engine sim needs --profile NAME|FILE"
        if self.engine == "sim" and self.model != "default":
            return "--engine sim: the profile names the model (leave --model out)"
        if self.engine != "sim" and (self.profile or self.sim_speed is not None):
            return "--profile and --sim-speed only with --engine sim"
        if self.sim_per_process < 1:
            return "--sim-per-process must be at least 1"
        return None


@dataclass
class Child:
    name: str
    process: subprocess.Popen[bytes]
    nodes: range = field(default_factory=lambda: range(0))  # the daemons it serves


class LocalFleet:
    """The fleet's processes and its folder. Nodes are numbered from 1: node I is the
    WarmNode `node-I`, on `port` + I."""

    def __init__(
        self,
        options: FleetOptions,
        folder: Path,
        token: str,
        warm: list[dict[str, Any]],
        say: Callable[[str], None] = lambda _: None,
    ) -> None:
        self.options = options
        self.folder = folder
        self.token = token
        self.warm = warm
        self.say = say
        self._stdout = sys.stderr.fileno() if options.output_to_stderr else None
        self.children: list[Child] = []
        self.nodes = 0  # the WarmNodes written so far (nodes added later count too)
        self.token_file = folder / "admin-token"
        self.scheme = "https" if options.tls else "http"
        self.router_url = f"{self.scheme}://{options.host}:{options.port}"
        self.certs: CertFiles | None = None  # with `tls`: the fleet's CA and certificate

    # -- starting and stopping ----------------------------------------------------------

    def start(self) -> None:
        """Writes the folder and starts the daemons, the operator and the router."""
        self.folder.mkdir(parents=True, exist_ok=True)
        self.token_file.write_text(self.token + "\n")
        self.token_file.chmod(0o600)
        if self.options.tls:  # one certificate for every component, both server and client
            hosts = sorted({"localhost", "127.0.0.1", self.options.host})
            self.certs = make_local_ca(self.folder / "tls", hosts)
        (self.folder / "warm-sets.yaml").write_text(yaml.safe_dump_all(self.warm, sort_keys=False))
        if self.options.learn_min_sessions:  # fleet-wide, or one set per tenant
            keys = self.options.api_keys_file
            tenants = sorted(KeysFile(keys).current().tenants) if keys else [None]
            learning = [learning_set(self.router_url, self.options.learn_min_sessions, t)
                        for t in tenants]  # fmt: skip
            (self.folder / "learned-set.yaml").write_text(
                yaml.safe_dump_all(learning, sort_keys=False)
            )
        self._start_daemons(1, self.options.nodes)
        self._write_nodes(self.options.nodes)
        me = [sys.executable, "-m", "warmfleet_cli"]
        resync = str(self.options.operator_resync_s)
        operator = [*me, "operator", "--local", str(self.folder), "--resync-seconds", resync]
        operator += self._tls_args(serve=False)
        self.children.append(Child("operator", _spawn(operator, stdout=self._stdout)))
        warm_sets = sum(d.get("kind") == "WarmPromptSet" for d in self.warm)
        self.say(f"operator       local mode on {self.folder} ({self.options.nodes} WarmNodes, "
                 f"{warm_sets} WarmPromptSets)")  # fmt: skip
        o = self.options
        router = [
            *me, "router", "--local", str(self.folder), "--admin-token-file",
            str(self.token_file), "--host", o.host, "--port", str(o.port), "--policy",
            o.policy, "--log-level", o.log_level, *(["--access-log"] if o.access_log else []),
            *self._tls_args(), *self._keys_args(),
            "--learn-min-sessions", str(o.learn_min_sessions),
        ]  # fmt: skip
        if o.quotas_file:
            router += ["--quotas", o.quotas_file]
        self.children.append(Child("router", _spawn(router, stdout=self._stdout)))
        self.say(f"router         {self.router_url}  (OpenAI API at /v1, GET /v1/router/status)")

    def dead(self) -> Child | None:
        """A child that exited (the fleet is broken), or None."""
        return next((c for c in self.children if c.process.poll() is not None), None)

    def ready(self) -> bool:
        """Every node the fleet has is ready at the router."""
        return len(ready_backends(self.router_url, self.token, self.verify)) == self.nodes

    @property
    def verify(self) -> ssl.SSLContext | bool:
        """What a client of this fleet verifies it with (its CA over TLS)."""
        if self.certs is None:
            return True
        return ssl.create_default_context(cafile=str(self.certs.ca))

    def stop(self, timeout: float = 20.0) -> None:
        stop_children(self.children, self.say, timeout)
        self.children = []

    # -- changing the fleet (simulated daemons with node control) -----------------------

    def add_nodes(self, count: int) -> range:
        """Starts `count` more daemons and then lists them as WarmNodes (the operator
        warms them; the router routes to them once ready). Returns their numbers."""
        first = self.nodes + 1
        host, port = self.options.host, self.options.port
        busy = [n for n in range(first, first + count) if not port_free(host, port + n)]
        if busy:
            raise OSError(f"ports for nodes {busy} on {self.options.host} are in use")
        self._start_daemons(first, count)
        self._write_nodes(self.nodes + count)
        return range(first, first + count)

    def kill_node(self, node: int) -> None:
        """Node `node` dies at once: its connections reset, its cache gone."""
        self._control(node, "kill")

    def stop_node(self, node: int) -> None:
        """Node `node` drains (its `/readyz` says so; the router moves its sessions), then
        stops."""
        self._control(node, "stop")

    def start_node(self, node: int) -> None:
        """A stopped or killed node starts again, empty; the operator warms it."""
        self._control(node, "start")

    def node_url(self, node: int) -> str:
        return f"{self.scheme}://{self.options.host}:{self.options.port + node}"

    # -- the rest -------------------------------------------------------------------------

    def _start_daemons(self, first: int, count: int) -> None:
        o = self.options
        me = [sys.executable, "-m", "warmfleet_cli"]
        per = o.sim_per_process if o.engine == "sim" else 1
        for group_first in range(first, first + count, per):
            n = min(per, first + count - group_first)
            port = o.port + group_first
            cmd = [
                *me, "serve", "--host", o.host, "--port", str(port),
                "--admin-token-file", str(self.token_file), *self._tls_args(client_ca=True),
                *self._keys_args(),
            ]  # fmt: skip
            if o.engine == "sim":
                assert o.profile is not None
                cmd += [
                    "--engine", "sim", "--profile", o.profile, "--daemon-name", "node",
                    "--nodes", str(n), "--first-node", str(group_first),
                ]  # fmt: skip
                if o.sim_speed is not None:
                    cmd += ["--sim-speed", str(o.sim_speed)]
                if o.node_control:
                    cmd += ["--node-control", "stdin"]
            else:
                cmd += ["--model", o.model, "--daemon-name", f"node-{group_first}"]
            if o.cache_memory_mb is not None:
                cmd += ["--cache-memory-mb", str(o.cache_memory_mb)]
            if o.block_size is not None:
                cmd += ["--block-size", str(o.block_size)]
            if o.max_context is not None:
                cmd += ["--max-context", str(o.max_context)]
            if o.max_output_tokens is not None:
                cmd += ["--max-output-tokens", str(o.max_output_tokens)]
            if o.drain_seconds is not None:
                cmd += ["--drain-seconds", str(o.drain_seconds)]
            if o.max_num_seqs is not None:
                cmd += ["--max-num-seqs", str(o.max_num_seqs)]
            if o.state_dir is not None:  # simulated daemons add node-I themselves
                own = "" if o.engine == "sim" else f"node-{group_first}"
                cmd += ["--state-dir", str(Path(o.state_dir) / own)]
            cmd += ["--log-level", o.log_level] + (["--access-log"] if o.access_log else [])
            last = group_first + n - 1
            name = f"node-{group_first}" if n == 1 else f"node-{group_first}..{last}"
            control = o.engine == "sim" and o.node_control
            process = _spawn(cmd, stdin=subprocess.PIPE if control else None, stdout=self._stdout)
            self.children.insert(
                self._daemons(), Child(name, process, range(group_first, last + 1))
            )
            if o.engine == "sim":
                self.say(f"simulated      {name} {self.scheme}://{o.host}:{port}-{port + n - 1}  "
                         f"(profile {o.profile})")  # fmt: skip
            else:
                url = f"{self.scheme}://{o.host}:{port}"
                self.say(f"daemon node-{group_first:<4} {url}  (model {o.model})")

    def _daemons(self) -> int:
        """Where the next daemon child goes: after the daemons, before the operator and
        the router (stopped in reverse: the router first)."""
        return sum(1 for c in self.children if c.nodes)

    def _tls_args(self, *, serve: bool = True, client_ca: bool = False) -> list[str]:
        """The TLS flags of a component: its certificate (served, or only presented as a
        client's), the CA it verifies the others with, and for the daemons the client CA
        their admin and peer routes require (mTLS)."""
        if self.certs is None:
            return []
        c = self.certs
        args = ["--tls-cert", str(c.cert), "--tls-key", str(c.key), "--tls-ca", str(c.ca)]
        return args + (["--tls-client-ca", str(c.ca)] if client_ca and serve else [])

    def _keys_args(self) -> list[str]:
        keys = self.options.api_keys_file
        return ["--api-keys-file", keys] if keys else []

    def _write_nodes(self, nodes: int) -> None:
        docs = fleet_documents(
            nodes, self.options.host, self.options.port + 1, self.token, self.scheme
        )
        _write_atomically(self.folder / "fleet.yaml", yaml.safe_dump_all(docs, sort_keys=False))
        self.nodes = nodes

    def _control(self, node: int, verb: str) -> None:
        child = next((c for c in self.children if node in c.nodes), None)
        if child is None or child.process.stdin is None:
            raise ValueError(f"node {node} takes no commands (simulated, with node control)")
        child.process.stdin.write(f"{verb} {node}\n".encode())
        child.process.stdin.flush()


def learning_set(router_url: str, min_sessions: int, tenant: str | None = None) -> dict[str, Any]:
    """The WarmPromptSet the operator fills with the router's learned warm prompts, for
    every node of the fleet: the fleet-wide ones (`learned`), or `tenant`'s, warm for
    that tenant only (`learned-TENANT`)."""
    name = "learned"
    if tenant is not None:
        slug = re.sub("[^a-z0-9]+", "-", tenant.lower()).strip("-")[:40]
        suffix = hashlib.blake2b(tenant.encode(), digest_size=3).hexdigest()
        name = f"learned-{slug}" if slug == tenant else f"learned-{slug}-{suffix}"
    spec: dict[str, Any] = {"nodeSelector": {"matchLabels": {FLEET_LABEL: "local"}}}
    if tenant is not None:
        spec["tenants"] = [tenant]
    return {
        "apiVersion": API_VERSION,
        "kind": "WarmPromptSet",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            **spec,
            "learn": {
                "router": {
                    "url": router_url,
                    "adminTokenSecretRef": {"name": TOKEN_SECRET, "key": "token"},
                },
                "minSessions": min_sessions,
            },
        },
    }


def fleet_documents(
    nodes: int, host: str, first_port: int, token: str, scheme: str = "http"
) -> list[dict[str, Any]]:
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
                    "url": f"{scheme}://{host}:{first_port + i}",
                    "adminTokenSecretRef": {"name": TOKEN_SECRET, "key": "token"},
                },
            }
        )
    return docs


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


def ready_backends(router_url: str, token: str, verify: ssl.SSLContext | bool = True) -> list[str]:
    """The router's backends that are ready, by name ([] when it does not answer)."""
    try:
        auth = {"Authorization": f"Bearer {token}"}  # the detail is the admin's
        url = f"{router_url}/v1/router/status"
        body = httpx.get(url, headers=auth, timeout=2, verify=verify).json()
    except (httpx.HTTPError, ValueError):
        return []
    return [b["name"] for b in body.get("backends", []) if b.get("health") == "ready"]


def stop_children(children: list[Child], say: Callable[[str], None], timeout: float) -> None:
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
            say(f"{child.name} did not stop in {timeout:.0f}s; killing it")
            child.process.kill()
            child.process.wait()
        if child.process.stdin is not None:
            with contextlib.suppress(OSError):
                child.process.stdin.close()
    if children:
        say("stopped")


def _spawn(
    cmd: list[str], quiet: bool = False, stdin: int | None = None, stdout: int | None = None
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        cmd,
        start_new_session=True,  # Ctrl-C reaches the parent only; it stops each child once
        stdin=stdin,
        stdout=subprocess.DEVNULL if quiet else stdout,
        stderr=subprocess.DEVNULL if quiet else None,
    )


def spawn_quiet(cmd: list[str]) -> subprocess.Popen[bytes]:
    """A helper process whose output nobody reads (Prometheus)."""
    return _spawn(cmd, quiet=True)


def _write_atomically(path: Path, text: str) -> None:
    # The operator and the router poll the folder: they must never read half a file.
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(text)
    os.replace(partial, path)
