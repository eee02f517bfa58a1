"""The one-shot capture endpoint: serves `POST /v1/chat/completions`, `/v1/messages`
(also `?beta=true`) and `/v1/responses` until one request with something static to warm
arrives, turns it into a warm prompt of its API's shape, hands it to `on_capture`
(which writes the file), answers the client with a short complete reply saying so, and
stops.

Requests with nothing to warm (no system prompt, leading messages or tools: an agent's
preflight) get the same short reply and are not captured. A request with no tools waits
up to SIDE_REQUEST_WAIT_S for one with tools, which is captured instead: agents send side
requests along with their first one (opencode's title request), and the one with tools
is the agent's own prompt. After the capture the endpoint answers for LINGER_S more
(counted from the last request) and stops: agents send background requests once their
turn ends (Qwen Code's memory extraction), which would otherwise retry a closed port
for minutes. A body that cannot be read
as its API's request gets a 400 in that API's shape and ends the capture, since a
client retrying it would only send it again. Bounded: bodies of at most MAX_BODY_BYTES
(413 beyond), each read within BODY_TIMEOUT_S (408), and `timeout` seconds in all.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import uvicorn
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from warmfleet_cli.warm_prompts import replies
from warmfleet_common.agent_apis.prefix import NothingToWarm, agent_name, warm_prompt
from warmfleet_common.agent_apis.shapes import SHAPES, ApiName
from warmfleet_common.contract import WarmPrompt

log = logging.getLogger("warmfleet.capture")
default_name = agent_name  # the agent's name where its User-Agent says it

MAX_BODY_BYTES = 16 << 20  # Claude Code's first request is ~50 KB, Codex's ~40 KB
BODY_TIMEOUT_S = 30.0
SIDE_REQUEST_WAIT_S = 5.0  # opencode sends its title request a few ms before its own
LINGER_S = 5.0  # Qwen Code's memory extraction follows its turn's end by ~4 s
ROUTES: dict[str, ApiName] = {s.path: s.name for s in SHAPES.values()}  # one per API shape


@dataclass(frozen=True)
class Captured:
    api: ApiName
    path: str
    client: str  # the User-Agent, e.g. claude-cli/2.1.332 (external, sdk-cli)
    prompt: WarmPrompt


class CaptureFailed(Exception):
    """The first request could not be captured (said to the client too)."""


class _Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class CaptureServer:
    """`run()` blocks until a request is captured (returns it), the capture fails
    (raises CaptureFailed), `timeout` passes (returns None) or `stop()` is called."""

    def __init__(
        self,
        sock: socket.socket,
        on_capture: Callable[[Captured], str],
        *,
        name: str | None = None,
        timeout: float = 600.0,
    ) -> None:
        self.sock = sock
        self.on_capture = on_capture  # writes the prompt; returns what the reply says
        self.name = name
        self.timeout = timeout
        self.result: Captured | None = None
        self.failure: str | None = None
        self._done = False
        self._lock = asyncio.Lock()
        self._captured = asyncio.Event()
        self._side_waiting = False
        self._stopping: asyncio.TimerHandle | None = None
        routes = [Route(path, self._handle, methods=["POST"]) for path in ROUTES]
        self.app = Starlette(routes=[*routes, Route("/{path:path}", _elsewhere, methods=_ANY)])
        config = uvicorn.Config(
            self.app,
            log_level="warning",
            timeout_keep_alive=5,
            timeout_graceful_shutdown=5,
            lifespan="off",
        )
        self.server = uvicorn.Server(config)

    @property
    def port(self) -> int:
        return int(self.sock.getsockname()[1])

    def run(self) -> Captured | None:
        timer = threading.Timer(self.timeout, self.stop)
        timer.daemon = True
        timer.start()
        try:
            self.server.run(sockets=[self.sock])
        finally:
            timer.cancel()
        if self.failure is not None:
            raise CaptureFailed(self.failure)
        return self.result

    def stop(self) -> None:
        self.server.should_exit = True

    async def _handle(self, request: Request) -> Response:
        api = ROUTES[request.url.path]
        if self.result is not None:  # captured: answered while the endpoint lingers
            self._linger()
            try:
                body = await _json_body(request)
            except _Refused as exc:
                return JSONResponse(replies.error(api, exc.message), status_code=exc.status)
            said = "warmfleet capture: not captured: this endpoint already took its request."
            return _reply(api, body, _model(body), said)
        if self._done:
            return _over(api)
        try:
            body = await _json_body(request)
        except _Refused as exc:
            return self._fail(api, exc.status, exc.message)
        model = _model(body)
        agent = request.headers.get("user-agent", "")
        try:
            prompt = warm_prompt(api, body, self.name or agent_name(api, agent))
        except NothingToWarm as exc:
            log.warning("Not captured (a request of %s): %s", agent or "a client", exc)
            return _reply(api, body, model, f"warmfleet capture: not captured: {exc}.")
        except (ValidationError, ValueError) as exc:
            return self._fail(api, 400, f"not a valid {request.url.path} request: {exc}")
        captured = Captured(api, request.url.path, agent, prompt)
        if not body.get("tools"):
            return await self._side_or_captured(body, model, captured)
        return await self._capture(body, model, captured)

    async def _capture(self, body: dict[str, Any], model: str, captured: Captured) -> Response:
        async with self._lock:  # one capture; the first one decides
            if self._done:
                return _over(captured.api)
            try:
                said = await asyncio.to_thread(self.on_capture, captured)
            except Exception as exc:  # the file could not be written: say so, end
                return self._fail(captured.api, 500, f"warmfleet capture: {exc}")
            self._done, self.result = True, captured
            self._captured.set()
            self._linger()
        return _reply(captured.api, body, model, said)

    def _linger(self) -> None:
        """Stop LINGER_S after now (after the last request, once captured)."""
        if self._stopping is not None:
            self._stopping.cancel()
        self._stopping = asyncio.get_running_loop().call_later(LINGER_S, self.stop)

    async def _side_or_captured(
        self, body: dict[str, Any], model: str, captured: Captured
    ) -> Response:
        """A request without tools: captured unless one with tools arrives meanwhile."""
        side = "a request without tools, sent along with the agent's request with tools"
        if self._side_waiting:
            return _reply(captured.api, body, model, f"warmfleet capture: not captured: {side}.")
        self._side_waiting = True
        try:
            await asyncio.wait_for(self._captured.wait(), SIDE_REQUEST_WAIT_S)
        except asyncio.TimeoutError:
            return await self._capture(body, model, captured)
        finally:
            self._side_waiting = False
        log.info("Not captured (a request of %s): %s", captured.client or "a client", side)
        return _reply(captured.api, body, model, f"warmfleet capture: not captured: {side}.")

    def _fail(self, api: ApiName, status: int, message: str) -> Response:
        self._done, self.failure = True, message
        return JSONResponse(
            replies.error(api, message), status_code=status, background=BackgroundTask(self.stop)
        )


async def _json_body(request: Request) -> dict[str, Any]:
    encoding = request.headers.get("content-encoding", "identity").lower()
    if encoding != "identity":
        raise _Refused(415, f"content-encoding {encoding!r} is not supported; send plain JSON")
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise _Refused(413, f"the body is larger than {MAX_BODY_BYTES} bytes")

    async def read() -> bytes:
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > MAX_BODY_BYTES:
                raise _Refused(413, f"the body is larger than {MAX_BODY_BYTES} bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    try:
        raw = await asyncio.wait_for(read(), BODY_TIMEOUT_S)
    except asyncio.TimeoutError as exc:
        raise _Refused(408, f"the body did not arrive within {BODY_TIMEOUT_S:.0f} s") from exc
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise _Refused(400, f"the body is not JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise _Refused(400, "the body is not a JSON object")
    return body


def _model(body: dict[str, Any]) -> str:
    return str(body["model"]) if isinstance(body.get("model"), str) else "warmfleet"


def _over(api: ApiName) -> Response:
    message = "the capture is over: this endpoint took one request"
    return JSONResponse(replies.error(api, message), status_code=503)


_ANY = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


async def _elsewhere(request: Request) -> Response:
    """Any other path: said in the terminal too (a base URL with one /v1 too many...)."""
    log.warning(
        "%s %s: not captured (this endpoint takes POST %s)",
        request.method,
        request.url.path,
        ", ".join(ROUTES),
    )
    message = f"warmfleet capture: no route {request.method} {request.url.path}"
    return JSONResponse({"error": {"message": message, "type": "not_found_error"}}, 404)


def _reply(api: ApiName, body: dict[str, Any], model: str, text: str) -> Response:
    if body.get("stream") is True:
        return StreamingResponse(
            replies.stream(api, model, text),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache"},
        )
    return JSONResponse(replies.reply(api, model, text))


def bind(host: str, port: int) -> socket.socket:
    """The listening socket (port 0: any free one), bound before the server starts so
    its address can be printed first."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(64)
    return sock
