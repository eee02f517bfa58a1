"""`warmfleet serve --register NAME`: the daemon creates or updates its own WarmNode, the
way a kubelet registers its Node. It only ever creates that one object or merge-patches
it (URL, the labels it was given, model and capacity annotations): never a delete, never
another object, and labels set by anyone else stay."""

from __future__ import annotations

import logging
import os
import re
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from warmfleet_common import kube
from warmfleet_common.crd import ANNOTATION_PREFIX, API_VERSION, WARMNODES, SecretRef

log = logging.getLogger(__name__)

# What kube-apiserver accepts (the WarmNode CRD's URL pattern, DNS-1123 names, label syntax).
_URL = re.compile(r"^https?://[^\s/]+(/[^\s]*)?$")
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")


class RegistrationError(Exception):
    """Registration is impossible as asked (bad flags, no credentials, refused)."""


@dataclass(frozen=True)
class Registration:
    """What this daemon says about itself in its WarmNode."""

    name: str
    url: str
    labels: dict[str, str] = field(default_factory=dict)
    model: str | None = None
    memory_bytes: int | None = None
    cache_budget_bytes: int | None = None
    token_ref: SecretRef | None = None

    def __post_init__(self) -> None:
        if len(self.name) > 253 or not _NAME.match(self.name):
            raise RegistrationError(
                f"--register {self.name!r}: a WarmNode name is a DNS-1123 subdomain "
                "(lower-case letters, digits, '-' and '.'; at most 253 characters)"
            )
        if len(self.url) > 2048 or not _URL.match(self.url) or not _port_ok(self.url):
            raise RegistrationError(
                f"--advertise-url {self.url!r}: expected http(s)://host[:port][/path]"
            )

    def body(self) -> dict[str, Any]:
        """The WarmNode to create; also the merge patch for an existing one."""
        annotations = {f"{ANNOTATION_PREFIX}registered-by": "warmfleet-serve"}
        for key, value in (
            ("model", self.model),
            ("capacity-memory-bytes", self.memory_bytes),
            ("capacity-cache-budget-bytes", self.cache_budget_bytes),
        ):
            if value is not None:
                annotations[ANNOTATION_PREFIX + key] = str(value)
        spec: dict[str, Any] = {"url": self.url}
        if self.token_ref is not None:
            spec["adminTokenSecretRef"] = self.token_ref.to_spec()
        return {
            "apiVersion": API_VERSION,
            "kind": "WarmNode",
            "metadata": {"name": self.name, "labels": self.labels, "annotations": annotations},
            "spec": spec,
        }


def parse_labels(text: str | None) -> dict[str, str]:
    """`k=v,k2=v2` (kubectl's syntax), validated as Kubernetes label keys and values."""
    labels: dict[str, str] = {}
    for item in (text or "").split(","):
        if not item.strip():
            continue
        key, sep, value = item.strip().partition("=")
        if not sep or not _label_key_ok(key) or len(value) > 63 or not _LABEL_VALUE.match(value):
            raise RegistrationError(
                f"--labels: {item.strip()!r} is not a label (key=value; a key is [prefix/]name, "
                "a value at most 63 letters, digits, '-', '_' or '.')"
            )
        labels[key] = value
    return labels


def parse_secret_ref(text: str) -> SecretRef:
    """`[NAMESPACE/]NAME[:KEY]`, KEY defaulting to `token` (the chart's)."""
    ref, _, key = text.partition(":")
    namespace, _, name = ref.rpartition("/")
    key = key or "token"
    if (
        not _NAME.match(name)
        or (namespace and not _NAME.match(namespace))
        or not re.match(r"^[-._a-zA-Z0-9]+$", key)
    ):
        raise RegistrationError(
            f"--admin-token-secret {text!r}: expected [NAMESPACE/]NAME[:KEY] of a Secret"
        )
    return SecretRef(name=name, key=key, namespace=namespace or None)


def default_url(host: str, port: int) -> str:
    """Where the operator can reach this daemon when no --advertise-url is given."""
    if host in ("127.0.0.1", "::1", "localhost") or host.startswith("127."):
        raise RegistrationError(
            f"--register: the daemon listens on {host}, which no other machine can reach; "
            "listen on --host 0.0.0.0 (with an admin token) or pass --advertise-url"
        )
    if host in ("0.0.0.0", "::", ""):
        host = socket.gethostname()
    return f"http://{host}:{port}"


def physical_memory_bytes() -> int | None:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def register(
    reg: Registration,
    *,
    kubeconfig: str | None = None,
    attempts: int = 5,
    backoff: float = 1.0,
    transport: httpx.BaseTransport | None = None,
) -> str:
    """Create the WarmNode, or merge-patch it if it exists; returns "created" or
    "updated". Connection errors and 5xx are retried (the API server may still be
    starting at boot); anything else is refused with the API server's message."""
    with _client(kubeconfig, transport) as http:
        path = WARMNODES
        error: RegistrationError | None = None
        for attempt in range(1, attempts + 1):
            try:
                return _create_or_patch(http, path, reg)
            except httpx.TransportError as exc:
                error = RegistrationError(f"cannot reach {http.base_url}: {exc}")
            except _Retryable as exc:
                error = RegistrationError(str(exc))
            if attempt < attempts:
                time.sleep(backoff * 2 ** (attempt - 1))
        assert error is not None
        raise error


class _Retryable(Exception):
    pass


def _create_or_patch(http: httpx.Client, path: str, reg: Registration) -> str:
    body = reg.body()
    r = http.get(f"{path}/{reg.name}")
    if r.status_code == 404:
        r = http.post(path, json=body)
        if r.status_code in (200, 201):
            return "created"
        if r.status_code != 409:  # 409: created meanwhile; patch it below
            _refuse(r, f"create WarmNode {reg.name}")
    elif r.status_code != 200:
        _refuse(r, f"read WarmNode {reg.name}")
    patch = {"metadata": body["metadata"], "spec": body["spec"]}
    r = http.patch(
        f"{path}/{reg.name}",
        json=patch,
        headers={"Content-Type": "application/merge-patch+json"},
    )
    if r.status_code != 200:
        _refuse(r, f"update WarmNode {reg.name}")
    return "updated"


def _refuse(r: httpx.Response, what: str) -> None:
    try:
        message = str(r.json().get("message") or r.text)
    except ValueError:
        message = r.text[:300]
    if r.status_code >= 500:
        raise _Retryable(f"cannot {what}: {r.status_code} {message}")
    hint = ""
    if r.status_code in (401, 403):
        hint = (
            " (the kubeconfig's identity needs the chart's registration ClusterRole: "
            "create, get and patch on warmnodes)"
        )
    raise RegistrationError(f"cannot {what}: {r.status_code} {message}{hint}")


def _client(kubeconfig: str | None, transport: httpx.BaseTransport | None) -> httpx.Client:
    try:
        return kube.sync_client(kube.login(kubeconfig), transport=transport)
    except kube.LoginError as exc:
        raise RegistrationError(str(exc)) from exc


def _label_key_ok(key: str) -> bool:
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not _NAME.match(prefix)):
        return False
    return 0 < len(name) <= 63 and bool(_LABEL_NAME.match(name))


def _port_ok(url: str) -> bool:
    try:
        port = httpx.URL(url).port
    except (httpx.InvalidURL, ValueError):
        return False
    return port is None or 0 < port <= 65535


def summary(reg: Registration, outcome: str) -> str:
    labels: Mapping[str, str] = reg.labels
    shown = ",".join(f"{k}={v}" for k, v in labels.items()) or "no labels"
    return f"WarmNode {reg.name} {outcome}: {reg.url} ({shown})"
