"""A daemon that registers its own WarmNode (`serve --register`) is found and probed by
the operator like any other node."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from support.kubeemu import Cluster, wait_for
from support.processes import free_port, start_daemon
from warmfleet_common.crd import WARMNODES


@pytest.mark.asyncio
async def test_registered_daemon_is_probed_by_the_operator(cluster: Cluster) -> None:
    """A real daemon started with --register appears as a WarmNode, and the operator
    (kopf, in process) probes it: reachable, its model, its cache budget."""
    port = free_port()
    daemon = await asyncio.to_thread(
        start_daemon, "--model", "tiny-random", "--register", "joiner-1",
        "--advertise-url", f"http://127.0.0.1:{port}", "--labels", "warmfleet.io/pool=agents",
        "--cache-memory-mb", "64", port=port,
    )  # fmt: skip
    try:

        async def probed() -> dict[str, Any] | None:
            node = await cluster.get(f"{WARMNODES}/joiner-1")
            status = (node or {}).get("status") or {}
            return node if status.get("reachable") is True and status.get("model") else None

        node = await wait_for(probed, timeout=60, what="the registered node probed")
        assert node["spec"]["url"] == f"http://127.0.0.1:{port}"
        assert node["metadata"]["labels"]["warmfleet.io/pool"] == "agents"
        assert node["status"]["cacheBudgetBytes"] == 64 << 20
        annotations = node["metadata"]["annotations"]
        assert annotations["warmfleet.io/capacity-cache-budget-bytes"] == str(64 << 20)
        assert annotations["warmfleet.io/model"] == "tiny-random"
    finally:
        daemon.stop()
