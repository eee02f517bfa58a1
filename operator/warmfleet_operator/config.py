"""The operator's own settings (kopf's are set in the startup handler): given by the
command line, handed to the handlers in kopf's memo."""

from __future__ import annotations

from dataclasses import dataclass, field

from warmfleet_common.tls import TlsOptions


@dataclass(frozen=True)
class OperatorConfig:
    resync_seconds: float = 30.0  # drift repair: every set reconciled this often
    probe_seconds: float = 5.0  # WarmNode probes when settled
    delete_retries: int = 5  # passes a delete waits for unreachable nodes, then lets go
    # Where Secrets referenced without a namespace are read; None: the namespace the
    # operator logged in with (the pod's, or the kubeconfig context's).
    operator_namespace: str | None = None
    # The daemons' certificates verified with `ca`; `cert` presented where they ask (mTLS).
    tls: TlsOptions = field(default_factory=TlsOptions)

    @property
    def fast_probe_seconds(self) -> float:
        """The probe period while warming, after a push, or unreachable."""
        return min(0.5, self.probe_seconds)
