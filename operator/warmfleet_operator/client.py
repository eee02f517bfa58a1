"""The operator's one I/O layer: HTTP to the daemons' push API. The few Kubernetes reads
and writes kopf does not do for us (admin-token Secrets, status patches from outside a
handler) are warmfleet_common.kube's KubeClient, shared with the router."""

from __future__ import annotations

import asyncio
import logging
import random
import ssl
from collections.abc import Sequence
from typing import Any, Protocol, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel, ValidationError

from warmfleet_common.contract import PeerRef, WarmSetSpec, WarmSetStatus
from warmfleet_common.crd import Node, SecretRef, SetKey
from warmfleet_common.grants import issue_grant
from warmfleet_common.kube import SecretError
from warmfleet_common.wire import DaemonStatus

log = logging.getLogger(__name__)
M = TypeVar("M", bound=BaseModel)


class DaemonError(Exception):
    """A daemon answered with an error, or could not be reached."""

    def __init__(self, message: str, *, status: int | None = None, sent: bool = True) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.sent = sent  # False: nothing reached the daemon (no token to send)

    @property
    def unreachable(self) -> bool:
        return self.status is None or self.status >= 500

    @property
    def auth(self) -> bool:
        """The daemon refused our admin token, or we have none to send."""
        return self.status in (401, 403)


class TokenSource(Protocol):
    async def token(self, ref: SecretRef) -> str:
        """The token, or SecretError saying which Secret is missing or unreadable."""
        ...


class DaemonClient:
    """Timeouts, bounded concurrency over all daemons, and retries with jittered
    backoff for what may pass (connection errors, 5xx such as a model still loading)."""

    def __init__(
        self,
        tokens: TokenSource,
        *,
        timeout: float = 10.0,
        attempts: int = 3,
        backoff: float = 0.25,
        max_concurrency: int = 16,
        transport: httpx.AsyncBaseTransport | None = None,
        verify: ssl.SSLContext | bool = True,
    ) -> None:
        self.tokens = tokens
        self.attempts = attempts
        self.backoff = backoff
        self._http = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout, connect=min(timeout, 3.0)),
            transport=transport,
            verify=verify,
        )
        self._slots = asyncio.Semaphore(max_concurrency)
        self.calls = 0  # HTTP requests made (the scale benchmark counts them)

    async def close(self) -> None:
        await self._http.aclose()

    async def get_warm_set(self, node: Node, key: SetKey) -> WarmSetStatus | None:
        r = await self._call(
            node, "GET", f"/v1/warm-sets/{key.namespace}/{key.name}", ok=(200, 404)
        )
        return None if r.status_code == 404 else _parse(WarmSetStatus, r)

    async def put_warm_set(
        self, node: Node, key: SetKey, spec: WarmSetSpec, *, peers: Sequence[Node] = ()
    ) -> WarmSetStatus:
        """Push `spec`; each of its peers found in `peers` with an admin token gets a
        grant to read that peer's blocks (the node would ask with its own token)."""
        spec = await self._granted(spec, peers)
        path = f"/v1/warm-sets/{key.namespace}/{key.name}"
        body = spec.model_dump(mode="json", exclude_none=True)
        r = await self._call(node, "PUT", path, json=body, ok=(202, 409))
        if r.status_code == 409:
            # The node already holds a newer generation (a concurrent pass pushed it):
            # nothing changed there, so report what it holds.
            r = await self._call(node, "GET", path, ok=(200,))
        return _parse(WarmSetStatus, r)

    async def _granted(self, spec: WarmSetSpec, peers: Sequence[Node]) -> WarmSetSpec:
        grants: dict[str, str] = {}
        for peer in peers:
            if peer.token_ref is None:
                continue
            try:
                token = await self.tokens.token(peer.token_ref)
            except SecretError as exc:  # that peer is then asked with the node's own token
                log.warning("no grant for peer %s: %s", peer.name, exc.message)
                continue
            grants[peer.url] = issue_grant(token, peer.url)
        if not grants:
            return spec
        named = [
            PeerRef(url=p, grant=grants[p]) if isinstance(p, str) and p in grants else p
            for p in spec.peers
        ]
        return spec.model_copy(update={"peers": named})

    async def delete_warm_set(self, node: Node, key: SetKey) -> bool:
        path = f"/v1/warm-sets/{key.namespace}/{key.name}"
        r = await self._call(node, "DELETE", path, ok=(200, 404))
        return r.status_code == 200

    async def healthy(self, node: Node) -> bool:
        """Whether the daemon answers its public /healthz (no token needed)."""
        try:
            async with self._slots:
                self.calls += 1
                r = await self._http.get(f"{node.url}/healthz")
        except httpx.TransportError:
            return False
        return r.status_code == 200

    async def learned(self, url: str, token_ref: SecretRef | None, tenant: str) -> list[Any]:
        """The warm prompts a router learned for `tenant` (`-`: the fleet-wide ones):
        its `GET /v1/router/learned` listing's `data`."""
        if not url.startswith(("http://", "https://")):
            raise DaemonError(f"spec.learn.router.url {url[:64]!r} is no http(s) URL", status=400)
        router = Node("router", url.rstrip("/"), token_ref=token_ref)
        r = await self._call(router, "GET", f"/v1/router/learned?tenant={quote(tenant)}", ok=(200,))
        try:
            data = r.json()["data"]
        except (ValueError, KeyError, TypeError) as exc:
            raise DaemonError(f"{url}: unexpected answer: {exc}", status=502) from exc
        if not isinstance(data, list):
            raise DaemonError(f"{url}: unexpected answer: data is no list", status=502)
        return data

    async def status(self, node: Node) -> DaemonStatus:
        r = await self._call(node, "GET", "/v1/status", ok=(200,))
        return _parse(DaemonStatus, r)

    async def _call(
        self, node: Node, method: str, path: str, *, ok: tuple[int, ...], json: Any = None
    ) -> httpx.Response:
        headers = {}
        if node.token_ref is not None:
            try:
                token = await self.tokens.token(node.token_ref)
            except SecretError as exc:  # nothing sent: a refusal unless the API server hiccuped
                raise DaemonError(
                    exc.message, status=None if exc.transient else 401, sent=False
                ) from exc
            headers["Authorization"] = f"Bearer {token}"
        url = f"{node.url}{path}"
        for attempt in range(1, self.attempts + 1):
            try:
                async with self._slots:
                    self.calls += 1
                    r = await self._http.request(method, url, headers=headers, json=json)
            except httpx.TransportError as exc:
                error = DaemonError(f"{method} {url}: {type(exc).__name__}: {exc}")
            else:
                if r.status_code in ok:
                    return r
                error = DaemonError(
                    f"{method} {url}: {r.status_code} {_message(r)}", status=r.status_code
                )
                if not error.unreachable:
                    raise error  # a 4xx will not get better by retrying
            if attempt < self.attempts:
                await asyncio.sleep(self.backoff * 2 ** (attempt - 1) * (0.5 + random.random()))
        raise error


def _parse(model: type[M], r: httpx.Response) -> M:
    try:
        return model.model_validate_json(r.content)
    except (ValueError, ValidationError) as exc:
        raise DaemonError(f"{r.request.url}: unexpected answer: {exc}", status=502) from exc


def _message(r: httpx.Response) -> str:
    try:
        return str(r.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return r.text[:200]
