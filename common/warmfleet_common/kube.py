"""One Kubernetes client set-up for every component: credentials from a kubeconfig or the
pod's service account, TLS and auth for httpx, and the few API calls warmfleet makes
outside kopf (admin-token Secrets, status patches, LIST and WATCH of WarmNodes).

The login rules are kopf's `login_with_kubeconfig`/`login_with_service_account`, written
again here because the router and the node agent must not import kopf. The operator
logs in through kopf and hands kopf's ConnectionInfo (the same fields) to `KubeClient`.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import ssl
import tempfile
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import httpx
import yaml

from warmfleet_common import bounded
from warmfleet_common.crd import API_VERSION, SecretRef, warmpromptsets_path

SERVICE_ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
WATCH_LINE_BYTES = 4 << 20


class LoginError(Exception):
    """No usable credentials (no kubeconfig, no service account, a broken kubeconfig)."""


class SecretError(Exception):
    """An admin-token Secret is missing, lacks its key or cannot be read."""

    def __init__(self, message: str, *, transient: bool) -> None:
        super().__init__(message)
        self.message = message
        self.transient = transient  # the API server failing for a moment: try again later


class WatchExpired(Exception):
    """A watch's resourceVersion is gone from the server's history: list again."""


class WatchFailed(Exception):
    """The server ended a watch with an error event other than 410."""


@dataclass(frozen=True)
class ConnectionInfo:
    """Credentials and where to use them; the field names are kopf.ConnectionInfo's, so
    either kind can be passed where `info` is asked for."""

    server: str | None
    ca_path: str | None = None
    ca_data: Any = None  # base64, as kubeconfigs hold it
    insecure: bool | None = None
    username: str | None = None
    password: str | None = None
    scheme: str | None = None
    token: str | None = None
    certificate_path: str | None = None
    certificate_data: Any = None
    private_key_path: str | None = None
    private_key_data: Any = None
    default_namespace: str | None = None


def login(kubeconfig: str | None = None, *, in_cluster_first: bool = False) -> ConnectionInfo:
    """Credentials from `kubeconfig` (else KUBECONFIG, else ~/.kube/config) or the pod's
    service account, the latter first when `in_cluster_first`; LoginError if neither."""
    try:
        if in_cluster_first:
            info = login_with_service_account() or login_with_kubeconfig(kubeconfig)
        else:
            info = login_with_kubeconfig(kubeconfig) or login_with_service_account()
    except (OSError, KeyError, TypeError, yaml.YAMLError) as exc:
        raise LoginError(f"cannot read the kubeconfig: {type(exc).__name__}: {exc}") from exc
    if info is not None and info.server:
        return info
    raise LoginError(
        "no Kubernetes credentials: pass --kubeconfig FILE or set KUBECONFIG "
        "(a ServiceAccount token from `kubectl create token`), or run in a pod"
    )


def login_with_kubeconfig(path: str | None = None) -> ConnectionInfo | None:
    """The current context of a kubeconfig (several files, `:`-separated: the first value
    wins), or None when there is none."""
    kubeconfig = path or os.environ.get("KUBECONFIG")
    if not kubeconfig and os.path.exists(os.path.expanduser("~/.kube/config")):
        kubeconfig = "~/.kube/config"
    if not kubeconfig:
        return None
    current: str | None = None
    contexts: dict[str, Any] = {}
    clusters: dict[str, Any] = {}
    users: dict[str, Any] = {}
    for item in filter(None, (p.strip() for p in kubeconfig.split(os.pathsep))):
        with open(os.path.expanduser(item), encoding="utf-8") as f:
            config = yaml.safe_load(f) or {}
        current = current or config.get("current-context")
        for kind, into in (("contexts", contexts), ("clusters", clusters), ("users", users)):
            for entry in config.get(kind) or []:
                into.setdefault(entry["name"], entry.get(kind[:-1]) or {})
    if current is None:
        raise LoginError(f"{kubeconfig}: no current-context")
    context = contexts[current]
    cluster, user = clusters[context["cluster"]], users[context["user"]]
    token = user.get("token") or (user.get("auth-provider") or {}).get("config", {}).get(
        "access-token"
    )
    if not token and user.get("tokenFile"):
        with open(os.path.expanduser(user["tokenFile"]), encoding="utf-8") as f:
            token = f.read().strip()
    return ConnectionInfo(
        server=cluster.get("server"),
        ca_path=cluster.get("certificate-authority"),
        ca_data=cluster.get("certificate-authority-data"),
        insecure=cluster.get("insecure-skip-tls-verify"),
        username=user.get("username"),
        password=user.get("password"),
        token=token,
        certificate_path=user.get("client-certificate"),
        certificate_data=user.get("client-certificate-data"),
        private_key_path=user.get("client-key"),
        private_key_data=user.get("client-key-data"),
        default_namespace=context.get("namespace"),
    )


def login_with_service_account(folder: str = SERVICE_ACCOUNT) -> ConnectionInfo | None:
    """The pod's service account, or None outside a pod."""
    token_path = os.path.join(folder, "token")
    if not os.path.exists(token_path):
        return None
    with open(token_path, encoding="utf-8") as f:
        token = f.read().strip()
    namespace = None
    if os.path.exists(os.path.join(folder, "namespace")):
        with open(os.path.join(folder, "namespace"), encoding="utf-8") as f:
            namespace = f.read().strip() or None
    ca = os.path.join(folder, "ca.crt")
    return ConnectionInfo(
        server="https://kubernetes.default.svc",
        ca_path=ca if os.path.exists(ca) else None,
        token=token or None,
        default_namespace=namespace,
    )


def ssl_context(info: Any) -> ssl.SSLContext:
    """TLS as the credentials say: the cluster's CA (or none checked), a client cert."""
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
    return context


def auth_headers(info: Any) -> dict[str, str]:
    if info.token:
        return {"Authorization": f"{info.scheme or 'Bearer'} {info.token}"}
    if info.username and info.password:
        raw = f"{info.username}:{info.password}".encode()
        return {"Authorization": f"Basic {base64.b64encode(raw).decode()}"}
    return {}


def sync_client(
    info: Any, *, timeout: float = 10.0, transport: httpx.BaseTransport | None = None
) -> httpx.Client:
    return httpx.Client(
        base_url=str(info.server),
        headers=auth_headers(info),
        verify=ssl_context(info),
        timeout=timeout,
        transport=transport,
    )


class KubeClient:
    """The Kubernetes API (async): admin-token Secrets, cached for a minute, status
    patches, and LIST and WATCH of any collection."""

    def __init__(self, *, default_namespace: str | None = None, ttl: float = 60.0) -> None:
        """`default_namespace`: where Secrets without a namespace are read; when None,
        the namespace of the credentials (the pod's, or the kubeconfig context's)."""
        self.default_namespace = default_namespace
        self.ttl = ttl
        self._http: httpx.AsyncClient | None = None
        self._secrets: dict[tuple[str, str], tuple[float, dict[str, str]]] = {}

    def configure_from(self, info: Any) -> None:
        self._http = httpx.AsyncClient(
            base_url=str(info.server),
            headers=auth_headers(info),
            verify=ssl_context(info),
            timeout=10.0,
        )
        if self.default_namespace is None:
            self.default_namespace = info.default_namespace or "default"

    async def token(self, ref: SecretRef) -> str:
        """The Secret's key, or SecretError saying which Secret is missing or unreadable."""
        namespace = ref.namespace or self.default_namespace or "default"
        where = f"admin token Secret {namespace}/{ref.name}"
        try:
            data = await self._secret(namespace, ref.name)
        except httpx.HTTPStatusError as exc:
            code = exc.response.status_code
            # The API server failing for a moment is not a refused token: retried, not dropped.
            raise SecretError(
                f"{where}: cannot read it ({code})", transient=code >= 500 or code == 429
            ) from exc
        except httpx.TransportError as exc:
            raise SecretError(f"{where}: cannot read it ({exc})", transient=True) from exc
        if data is None:
            raise SecretError(f"{where} not found", transient=False)
        if ref.key not in data:
            raise SecretError(f"{where} has no key {ref.key!r}", transient=False)
        return data[ref.key]

    async def patch_status(self, path: str, status: Mapping[str, Any]) -> None:
        """Merge-patch an object's status (None removes a field); gone objects are fine."""
        r = await self._require().patch(
            f"{path}/status",
            json={"status": status},
            headers={"Content-Type": "application/merge-patch+json"},
        )
        if r.status_code == 404:
            return  # deleted meanwhile
        r.raise_for_status()

    async def patch_node_status(self, name: str, status: Mapping[str, Any]) -> None:
        await self.patch_status(f"/apis/{API_VERSION}/warmnodes/{name}", status)

    async def patch_set_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        await self.patch_status(f"{warmpromptsets_path(namespace)}/{name}", status)

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
            # etcd holds objects up to 1.5 MiB: no event line is longer than that.
            async for line in bounded.lines(r.aiter_bytes(), WATCH_LINE_BYTES, what=path):
                if not line.strip():
                    continue
                event = json.loads(line)
                if not isinstance(event, dict):
                    raise ValueError(f"watch {path}: not an event: {line[:200]!r}")
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
        data = secret_data(r.json())
        self._secrets[(namespace, name)] = (time.monotonic(), data)
        return data

    def _require(self) -> httpx.AsyncClient:
        if self._http is None:
            raise RuntimeError("KubeClient used before it was given credentials")
        return self._http


def secret_data(secret: Mapping[str, Any]) -> dict[str, str]:
    """A Secret's keys, decoded (`data` is base64, `stringData` plain), whitespace trimmed."""
    data = {k: base64.b64decode(v).decode().strip() for k, v in (secret.get("data") or {}).items()}
    data.update({k: str(v).strip() for k, v in (secret.get("stringData") or {}).items()})
    return data


def _load_client_cert(context: ssl.SSLContext, info: Any) -> None:
    """Load the client certificate; ssl wants files, kubeconfigs often inline the data,
    so inline data is written to a private folder, read, and removed at once."""
    cert, key = info.certificate_path, info.private_key_path
    folder = None
    if info.certificate_data and info.private_key_data:
        folder = tempfile.mkdtemp(prefix="warmfleet-kube-")
        cert, key = os.path.join(folder, "tls.crt"), os.path.join(folder, "tls.key")
        for path, data in ((cert, info.certificate_data), (key, info.private_key_data)):
            with open(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600), "wb") as f:
                f.write(base64.b64decode(data))
    if not (cert and key):
        return
    try:
        context.load_cert_chain(cert, key)
    finally:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
