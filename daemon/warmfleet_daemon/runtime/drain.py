"""A SIGTERM drains before it stops: for `--drain-seconds` the daemon answers `/readyz`
with 503 `draining` (the router stops sending it new requests and asks the daemons its
sessions move to to copy their blocks from this one, `POST /v1/cache/pull`), keeps
serving what it has and its blocks to peers, then stops as uvicorn does (in-flight
requests get its graceful-shutdown time). A second signal, or SIGINT, stops at once."""

from __future__ import annotations

import logging
import signal
import socket
import threading
import time
from types import FrameType

import uvicorn

from warmfleet_daemon.runtime.assembly import DaemonState

log = logging.getLogger(__name__)


class DrainingServer(uvicorn.Server):  # type: ignore[misc]  # uvicorn ships no types here
    def __init__(self, config: uvicorn.Config, state: DaemonState, drain_s: float) -> None:
        super().__init__(config)
        self.state = state
        self.drain_s = drain_s
        self._timer: threading.Timer | None = None

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        # Cache-event streams wait for events forever: ended first, they do not hold the
        # stop for its graceful timeout (and end cut, with a traceback).
        if self.state.ready is not None:
            self.state.ready.events.end_streams()
        await super().shutdown(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if sig != signal.SIGTERM or self.drain_s <= 0 or self._timer is not None:
            super().handle_exit(sig, frame)
            return
        self.state.draining_until = time.time() + self.drain_s
        if self.state.ready is not None:  # routers following its events hear it at once
            self.state.ready.events.nudge_streams()
        log.warning(
            "SIGTERM: draining for %.0fs (/readyz answers 'draining'; peers may copy this "
            "daemon's blocks), then stopping; signal again to stop now",
            self.drain_s,
        )
        self._timer = threading.Timer(self.drain_s, super().handle_exit, (sig, None))
        self._timer.daemon = True
        self._timer.start()
