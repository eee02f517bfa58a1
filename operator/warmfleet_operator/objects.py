"""What the reconcile core works on: plain, immutable data, no I/O."""

from __future__ import annotations

from dataclasses import dataclass

from warmfleet_common.contract import WarmSetSpec, WarmSetStatus
from warmfleet_common.crd import Node

FINALIZER = "warmfleet.io/unwarm"


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
    # The nodes `spec.peers` names: the client issues each a grant with its admin token.
    peers: tuple[Node, ...] = ()


@dataclass(frozen=True)
class Remove:
    node: Node


class InvalidSpec(ValueError):
    """The WarmPromptSet cannot be turned into pushes; `reason` names the condition."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
