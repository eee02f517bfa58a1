"""Many simulated daemons in one process (`warmfleet serve --engine sim --nodes N`), so
that a hundred simulated Macs fit on a few cores: each is a whole daemon (its app, engine
thread, warm sets, status and metrics) on a port of its own, all on one event loop.

The process takes SIGINT and SIGTERM for all of them (uvicorn's servers would each take
them over in turn, and only the last would hear one); a SIGTERM drains each as alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
from collections.abc import Iterator

import uvicorn

from warmfleet_common.logs import quiet_access_log
from warmfleet_daemon.api.app import create_app
from warmfleet_daemon.runtime.drain import DrainingServer
from warmfleet_daemon.settings import DaemonSettings


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


def serve_many(members: list[DaemonSettings], listeners: list[socket.socket]) -> bool:
    """Serve every member on its listener until a signal; True if all of them started."""
    servers: list[_Member] = []
    for settings in members:
        app = create_app(settings)
        config = uvicorn.Config(
            app,
            host=settings.host,
            port=settings.port,
            log_level=settings.log_level,
            timeout_graceful_shutdown=5,
        )
        servers.append(_Member(config, app.state.daemon, settings.drain_seconds))
    quiet_access_log(show_polls=members[0].access_log)  # after uvicorn configured logging

    async def main() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, _tell_all, servers, sig)
        await asyncio.gather(*(s.serve(sockets=[sock]) for s, sock in zip(servers, listeners)))

    asyncio.run(main())
    return all(s.started for s in servers)


def _tell_all(servers: list[_Member], sig: int) -> None:
    for server in servers:
        server.handle_exit(sig, None)
