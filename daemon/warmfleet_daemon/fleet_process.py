"""Many simulated daemons in one process (`warmfleet serve --engine sim --nodes N`), so
that a hundred simulated Macs fit on a few cores: each is a whole daemon (its app, engine
thread, warm sets, status and metrics) on a port of its own, all on one event loop.

The process takes SIGINT and SIGTERM for all of them (uvicorn's servers would each take
them over in turn, and only the last would hear one); a SIGTERM drains each as alone.

With `--node-control stdin` it also reads one command a line on stdin, so that a replay
can lose, restart and drain single nodes as a fleet does (`warmfleet sim run`):
`kill I` (the node dies: its connections are reset, its cache is gone), `stop I` (it
drains as on a SIGTERM, then stops) and `start I` (a stopped node starts again, empty).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import uvicorn

from warmfleet_common.bounded import SERVER_KEEP_ALIVE_S
from warmfleet_common.heap import freeze_heap
from warmfleet_common.logs import quiet_access_log
from warmfleet_common.tls import install_https
from warmfleet_daemon.api.app import create_app
from warmfleet_daemon.runtime.drain import DrainingServer
from warmfleet_daemon.settings import DaemonSettings
from warmfleet_daemon.support import open_files

log = logging.getLogger(__name__)
COMMANDS = ("kill", "stop", "start")


class _Member(DrainingServer):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield  # the process's handler passes signals on to every member


def member_settings(
    settings: DaemonSettings, nodes: int, first: int, port: int
) -> list[DaemonSettings]:
    """Node i (first, first+1, ...) listens on `port` + i - first, is named
    `{daemon name}-{i}` and keeps its state in `{state dir}/node-{i}`."""
    name = settings.daemon_name or "node"
    out = []
    for i in range(first, first + nodes):
        update: dict[str, object] = {"port": port + i - first, "daemon_name": f"{name}-{i}"}
        if settings.state_dir:
            update["state_dir"] = f"{settings.state_dir}/node-{i}"
        out.append(settings.model_copy(update=update))
    return out


def serve_many(
    members: list[DaemonSettings],
    listeners: list[socket.socket],
    first: int = 1,
    control: bool = False,
) -> bool:
    """Serve every member (node `first`, `first`+1, ...) on its listener until a signal;
    True if all of them started. `control`: take node commands on stdin."""
    fleet = _Fleet(dict(enumerate(members, start=first)))

    async def main() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, fleet.signal_all, sig)
        for node, sock in zip(fleet.settings, listeners):
            fleet.start(node, sock)
        reader = loop.create_task(fleet.read_commands()) if control else None  # held: kept
        await fleet.wait(control)
        if reader is not None:
            reader.cancel()

    asyncio.run(main())
    return fleet.all_started


@dataclass
class _Running:
    server: _Member
    task: asyncio.Task[None]
    killed: bool = False


class _Fleet:
    def __init__(self, settings: dict[int, DaemonSettings]) -> None:
        self.settings = settings
        self.running: dict[int, _Running] = {}
        self.all_started = True
        self.stopping = False  # a signal came: nodes are not started again
        self._loaded: set[int] = set()  # nodes whose engine has loaded once
        self._loaded_lock = threading.Lock()

    def start(self, node: int, sock: socket.socket | None = None) -> None:
        settings = self.settings[node]
        if sock is None:  # a restart binds its port again
            family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
            sock = socket.create_server((settings.host, settings.port), family=family)
        app = create_app(settings)
        open_files.restore()  # mlx-lm's import lowered it: fifty daemons' sockets need more
        app.state.daemon.on_ready.append(lambda: self._loaded_once(node))
        config = uvicorn.Config(
            app,
            host=settings.host,
            port=settings.port,
            log_level=settings.log_level,
            timeout_graceful_shutdown=5,
            timeout_keep_alive=SERVER_KEEP_ALIVE_S,
        )
        reloader = None
        if settings.tls_cert:
            reloader = install_https(config, settings.tls())
        quiet_access_log(show_polls=settings.access_log)  # after uvicorn configured logging
        server = _Member(config, app.state.daemon, settings.drain_seconds)
        first = node not in self.running
        task = asyncio.get_running_loop().create_task(self._serve(server, sock, first))
        if reloader is not None:  # one per running node: it ends with it
            task.add_done_callback(lambda _: reloader.stop())
        self.running[node] = _Running(server, task)

    def _loaded_once(self, node: int) -> None:
        """On a node's loader thread, its engine loaded: once every node has (and after
        each restart), what is alive moves out of the collector's sight, as one daemon's
        heap does. Unfrozen, fifty daemons' heaps made each full collection long enough
        for the process's threads to pile up on the GIL behind it."""
        with self._loaded_lock:
            restart = node in self._loaded
            self._loaded.add(node)
            if restart or len(self._loaded) == len(self.settings):
                freeze_heap()

    async def _serve(self, server: _Member, sock: socket.socket, first: bool) -> None:
        await server.serve(sockets=[sock])
        if first:
            self.all_started &= bool(server.started)

    def kill(self, node: int) -> None:
        """As a crash: every connection reset at once, nothing drained, the cache lost."""
        running = self.running.get(node)
        if running is None or running.task.done():
            return
        running.killed = True
        server = running.server
        for connection in list(server.server_state.connections):
            transport = getattr(connection, "transport", None)
            if transport is not None:
                transport.abort()
        server.should_exit = True  # the listener closes now; the engine stops after

    def signal_all(self, sig: int) -> None:
        self.stopping = True
        for running in self.running.values():
            running.server.handle_exit(sig, None)

    async def wait(self, control: bool) -> None:
        """Until every node has stopped: after a signal, or (without node control, where
        a stopped node may start again) when they all ended on their own."""
        while True:
            await asyncio.gather(*(r.task for r in self.running.values()), return_exceptions=True)
            ended = all(r.task.done() for r in self.running.values())  # none started since
            if ended and (self.stopping or not control):
                return
            await asyncio.sleep(0.2)

    async def read_commands(self) -> None:
        # A pipe read by the loop, not a thread: a thread blocked in readline would hold
        # the process's exit.
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        while line := await reader.readline():
            self.command(line.decode(errors="replace"))

    def command(self, line: str) -> None:
        verb, _, arg = line.strip().partition(" ")
        try:
            node = int(arg)
        except ValueError:
            node = -1
        if verb not in COMMANDS or node not in self.settings:
            log.warning("node control: %r: expected kill|stop|start NODE", line.strip())
            return
        running = self.running.get(node)
        alive = running is not None and not running.task.done()
        if verb == "kill":
            self.kill(node)
        elif verb == "stop" and alive and running is not None:
            running.server.handle_exit(signal.SIGTERM, None)
        elif verb == "start" and not self.stopping:
            if not alive:
                self._restart(node)
            elif running is not None and running.server.should_exit:
                # Still stopping (its listener is closed, its engine not yet): start it
                # once it has stopped, rather than dropping the command.
                running.task.add_done_callback(lambda _: self._restart(node))

    def _restart(self, node: int) -> None:
        running = self.running.get(node)
        if self.stopping or (running is not None and not running.task.done()):
            return
        try:
            self.start(node)
        except OSError as exc:
            log.warning("node control: cannot start node %d: %s", node, exc)
