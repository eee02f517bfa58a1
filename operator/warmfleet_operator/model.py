"""What the reconcile core works on: plain, immutable data, no I/O."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from warmfleet_daemon.contract import WarmSetSpec, WarmSetStatus

GROUP = "warmfleet.io"
VERSION = "v1alpha1"
FINALIZER = "warmfleet.io/unwarm"


@dataclass(frozen=True)
class SecretRef:
    name: str
    key: str
    namespace: str | None = None


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
            token_ref=SecretRef(ref["name"], ref["key"], ref.get("namespace")) if ref else None,
            model=(body.get("status") or {}).get("model"),
        )


@dataclass(frozen=True)
class SetKey:
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class Observation:
    """What one node reported for one set: its status, or why there is none."""

    node: str
    reachable: bool
    status: WarmSetStatus | None = None  # None: the node does not have the set
    error: str | None = None
    rejected: bool = False  # the node refused the push (4xx): retried with back-off
    unauthorized: bool = False  # it refused our admin token, or we have none to send


@dataclass(frozen=True)
class Push:
    node: Node
    spec: WarmSetSpec


@dataclass(frozen=True)
class Remove:
    node: Node


class InvalidSpec(ValueError):
    """The WarmPromptSet cannot be turned into pushes; `reason` names the condition."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
