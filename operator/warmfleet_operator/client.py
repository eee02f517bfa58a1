"""The operator's one I/O layer: HTTP to the daemons' push API, and the few Kubernetes
reads and writes kopf does not do for us (admin-token Secrets, status patches from
outside a handler)."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import random
import shutil
import ssl
import tempfile
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any, Protocol

import httpx
from pydantic import ValidationError

from warmfleet_daemon.contract import WarmSetSpec, WarmSetStatus
from warmfleet_operator.model import GROUP, VERSION, Node, SecretRef, SetKey

log = logging.getLogger(__name__)


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


class WatchExpired(Exception):
    """A watch's resourceVersion is gone from the server's history: list again."""


class WatchFailed(Exception):
    """The server ended a watch with an error event other than 410."""


class TokenSource(Protocol):
    async def token(self, ref: SecretRef) -> str:
        """The token, or DaemonError(status=401) saying which Secret is missing or unreadable."""
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
    ) -> None:
        self.tokens = tokens
        self.attempts = attempts
        self.backoff = backoff
        self._http = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout, connect=min(timeout, 3.0)), transport=transport
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

    async def put_warm_set(self, node: Node, key: SetKey, spec: WarmSetSpec) -> WarmSetStatus:
        path = f"/v1/warm-sets/{key.namespace}/{key.name}"
        body = spec.model_dump(mode="json", exclude_none=True)
        r = await self._call(node, "PUT", path, json=body, ok=(202, 409))
        if r.status_code == 409:
            # The node already holds a newer generation (a concurrent pass pushed it):
            # nothing changed there, so report what it holds.
            r = await self._call(node, "GET", path, ok=(200,))
        return _parse(WarmSetStatus, r)

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

    async def status(self, node: Node) -> dict[str, Any]:
        r = await self._call(node, "GET", "/v1/status", ok=(200,))
        return dict(r.json())

    async def _call(
        self, node: Node, method: str, path: str, *, ok: tuple[int, ...], json: Any = None
    ) -> httpx.Response:
        headers = {}
        if node.token_ref is not None:
            try:
                token = await self.tokens.token(node.token_ref)
            except DaemonError as exc:
                exc.sent = False
                raise
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


class KubeClient:
    """The Kubernetes API with kopf's credentials (captured by the login handler):
    admin-token Secrets, cached for a minute, and status patches."""

    def __init__(self, *, default_namespace: str | None = None, ttl: float = 60.0) -> None:
        """`default_namespace`: where Secrets without a namespace are read; when None,
        the namespace kopf logged in with (the pod's, or the kubeconfig context's)."""
        self.default_namespace = default_namespace
        self.ttl = ttl
        self._http: httpx.AsyncClient | None = None
        self._secrets: dict[tuple[str, str], tuple[float, dict[str, str]]] = {}

    def configure_from(self, info: Any) -> None:
        """Use the credentials kopf logged in with (a kopf.ConnectionInfo)."""
        context = ssl.create_default_context()
        if info.insecure:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        elif info.ca_path or info.ca_data:
            context = ssl.create_default_context(
                cafile=info.ca_path,
                cadata=base64.b64decode(info.ca_data).decode() if info.ca_data else None,
            )
        _load_client_cert(context, info)
        headers = {}
        if info.token:
            headers["Authorization"] = f"{info.scheme or 'Bearer'} {info.token}"
        elif info.username and info.password:
            raw = f"{info.username}:{info.password}".encode()
            headers["Authorization"] = f"Basic {base64.b64encode(raw).decode()}"
        self._http = httpx.AsyncClient(
            base_url=str(info.server), headers=headers, verify=context, timeout=10.0
        )
        if self.default_namespace is None:
            self.default_namespace = info.default_namespace or "default"

    async def token(self, ref: SecretRef) -> str:
        namespace = ref.namespace or self.default_namespace or "default"
        where = f"admin token Secret {namespace}/{ref.name}"
        try:
            data = await self._secret(namespace, ref.name)
        except httpx.HTTPStatusError as exc:
            code = exc.response.status_code
            # The API server failing for a moment is not a refused token: retried, not dropped.
            transient = code >= 500 or code == 429
            raise DaemonError(
                f"{where}: cannot read it ({code})", status=None if transient else 401
            ) from exc
        except httpx.TransportError as exc:
            raise DaemonError(f"{where}: cannot read it ({exc})", status=None) from exc
        if data is None:
            raise DaemonError(f"{where} not found", status=401)
        if ref.key not in data:
            raise DaemonError(f"{where} has no key {ref.key!r}", status=401)
        return data[ref.key]

    async def patch_node_status(self, name: str, status: Mapping[str, Any]) -> None:
        """Merge-patch a WarmNode's status (None removes a field)."""
        r = await self._require().patch(
            f"/apis/{GROUP}/{VERSION}/warmnodes/{name}/status",
            json={"status": status},
            headers={"Content-Type": "application/merge-patch+json"},
        )
        if r.status_code == 404:
            return  # deleted meanwhile
        r.raise_for_status()

    async def patch_set_status(self, key: SetKey, status: Mapping[str, Any]) -> None:
        http = self._require()
        path = (
            f"/apis/{GROUP}/{VERSION}/namespaces/{key.namespace}/warmpromptsets/{key.name}/status"
        )
        r = await http.patch(
            path, json={"status": status}, headers={"Content-Type": "application/merge-patch+json"}
        )
        if r.status_code == 404:
            return  # deleted meanwhile
        r.raise_for_status()

    async def list_items(self, path: str) -> list[dict[str, Any]]:
        """The items of a LIST (e.g. every WarmNode, for the router)."""
        r = await self._require().get(path)
        r.raise_for_status()
        return list(r.json().get("items") or [])

    async def list_versioned(self, path: str) -> tuple[list[dict[str, Any]], str]:
        """The items of a LIST and its resourceVersion (where a watch of it starts)."""
        r = await self._require().get(path)
        r.raise_for_status()
        body = r.json()
        version = str((body.get("metadata") or {}).get("resourceVersion") or "")
        return list(body.get("items") or []), version

    async def watch(
        self, path: str, resource_version: str, timeout_seconds: float
    ) -> AsyncIterator[dict[str, Any]]:
        """The events of a watch from `resource_version` (ADDED, MODIFIED, DELETED,
        BOOKMARK) until the server ends it after `timeout_seconds`. Raises WatchExpired
        when that version is too old to resume from (list again), httpx errors when
        the stream breaks."""
        params = {
            "watch": "true",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(max(1, round(timeout_seconds))),
        }
        # The server ends the stream itself; a silent dead connection must not hang us.
        timeout = httpx.Timeout(10.0, read=timeout_seconds + 30.0)
        async with self._require().stream("GET", path, params=params, timeout=timeout) as r:
            if r.status_code == 410:
                raise WatchExpired(f"{path} at {resource_version}: 410 Gone")
            r.raise_for_status()
            async for line in r.aiter_lines():
                if not line.strip():
                    continue
                event = json.loads(line)
                if not isinstance(event, dict):
                    raise ValueError(f"watch {path}: not an event: {line[:200]}")
                if event.get("type") == "ERROR":
                    status = event.get("object") or {}
                    if status.get("code") == 410:
                        raise WatchExpired(f"{path} at {resource_version}: {status.get('message')}")
                    raise WatchFailed(f"{path}: {status.get('code')} {status.get('message')}")
                yield event

    async def close(self) -> None:
        if self._http is not None:
            await self._http.aclose()

    async def _secret(self, namespace: str, name: str) -> dict[str, str] | None:
        cached = self._secrets.get((namespace, name))
        if cached and time.monotonic() - cached[0] < self.ttl:
            return cached[1]
        r = await self._require().get(f"/api/v1/namespaces/{namespace}/secrets/{name}")
        if r.status_code == 404:
            return None
        r.raise_for_status()
        body = r.json()
        data = {
            k: base64.b64decode(v).decode().strip() for k, v in (body.get("data") or {}).items()
        }
        data.update({k: str(v).strip() for k, v in (body.get("stringData") or {}).items()})
        self._secrets[(namespace, name)] = (time.monotonic(), data)
        return data

    def _require(self) -> httpx.AsyncClient:
        if self._http is None:
            raise RuntimeError("KubeClient used before the operator logged in")
        return self._http


def _client_cert(info: Any) -> tuple[str, str] | None:
    """Client certificate files: ssl wants paths, kubeconfigs often inline the data."""
    cert, key = info.certificate_path, info.private_key_path
    if info.certificate_data and info.private_key_data:
        folder = tempfile.mkdtemp(prefix="warmfleet-kube-")
        cert, key = os.path.join(folder, "tls.crt"), os.path.join(folder, "tls.key")
        for path, data in ((cert, info.certificate_data), (key, info.private_key_data)):
            with open(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600), "wb") as f:
                f.write(base64.b64decode(data))
    return (cert, key) if cert and key else None


def _load_client_cert(context: ssl.SSLContext, info: Any) -> None:
    """Load the client certificate, then remove the key file written for an inline one."""
    cert = _client_cert(info)
    if cert is None:
        return
    try:
        context.load_cert_chain(*cert)
    finally:
        if info.certificate_data and info.private_key_data:
            shutil.rmtree(os.path.dirname(cert[0]), ignore_errors=True)


def _parse(model: type[WarmSetStatus], r: httpx.Response) -> WarmSetStatus:
    try:
        return model.model_validate(r.json())
    except (ValueError, ValidationError) as exc:
        raise DaemonError(f"{r.request.url}: unexpected answer: {exc}", status=502) from exc


def _message(r: httpx.Response) -> str:
    try:
        return str(r.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return r.text[:200]
