"""The names of warmfleet's Kubernetes resources, defined once, and the WarmNode as the
components read it: the operator (which reconciles it), the router (which discovers
daemons from it), the node agent (which registers it) and `warmfleet up` (which writes
it). The schemas themselves are in crds/ (the source of truth)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

GROUP = "warmfleet.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
WARMNODES = f"/apis/{API_VERSION}/warmnodes"  # cluster-scoped
ANNOTATION_PREFIX = f"{GROUP}/"
FLEET_LABEL = f"{GROUP}/fleet"
POOL_LABEL = f"{GROUP}/pool"  # the examples' WarmPromptSet selects the `agents` pool


def warmpromptsets_path(namespace: str) -> str:
    return f"/apis/{API_VERSION}/namespaces/{namespace}/warmpromptsets"


@dataclass(frozen=True)
class SecretRef:
    """A key of a Secret (an admin token); no namespace: the reader's default."""

    name: str
    key: str
    namespace: str | None = None

    @staticmethod
    def from_spec(ref: dict[str, Any]) -> SecretRef:
        return SecretRef(ref["name"], ref["key"], ref.get("namespace"))

    def to_spec(self) -> dict[str, str]:
        out = {"name": self.name, "key": self.key}
        if self.namespace:
            out["namespace"] = self.namespace
        return out


@dataclass(frozen=True)
class SetKey:
    """A WarmPromptSet's identity."""

    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class Node:
    """A WarmNode: a daemon and the labels that put it in pools."""

    name: str
    url: str
    labels: dict[str, str] = field(default_factory=dict)
    token_ref: SecretRef | None = None
    model: str | None = None  # from its status, once probed

    @staticmethod
    def from_object(body: dict[str, Any]) -> Node:
        meta, spec = body.get("metadata", {}), body.get("spec", {})
        ref = spec.get("adminTokenSecretRef")
        return Node(
            name=meta["name"],
            url=str(spec.get("url", "")).rstrip("/"),
            labels=dict(meta.get("labels") or {}),
            token_ref=SecretRef.from_spec(ref) if ref else None,
            model=(body.get("status") or {}).get("model"),
        )
