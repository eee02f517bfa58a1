"""kmock's Kubernetes emulator, made a little more like kube-apiserver, and helpers
for tests that drive the operator through it."""

from __future__ import annotations

import asyncio
import datetime
import itertools
import uuid
from dataclasses import dataclass
from typing import Any

import httpx
import jsonpatch
import kmock

ALL_VERBS = {"list", "watch", "get", "create", "patch", "update", "delete"}
RESOURCES = {
    "warmfleet.io/v1alpha1/warmpromptsets": kmock.ResourceInfo(
        kind="WarmPromptSet", namespaced=True, verbs=ALL_VERBS, subresources={"status"}
    ),
    "warmfleet.io/v1alpha1/warmnodes": kmock.ResourceInfo(
        kind="WarmNode", namespaced=False, verbs=ALL_VERBS, subresources={"status"}
    ),
    "v1/configmaps": kmock.ResourceInfo(kind="ConfigMap", namespaced=True, verbs=ALL_VERBS),
    "v1/secrets": kmock.ResourceInfo(kind="Secret", namespaced=True, verbs=ALL_VERBS),
    "v1/events": kmock.ResourceInfo(kind="Event", namespaced=True, verbs=ALL_VERBS),
    "v1/namespaces": kmock.ResourceInfo(kind="Namespace", namespaced=False, verbs=ALL_VERBS),
    "apiextensions.k8s.io/v1/customresourcedefinitions": kmock.ResourceInfo(
        kind="CustomResourceDefinition", namespaced=False, verbs=ALL_VERBS
    ),
}


class Emulator(kmock.KubernetesEmulator):
    """kmock's emulator plus what kube-apiserver does and kopf relies on: a uid on
    creation (kopf keys its per-object state by it), a resourceVersion that changes
    on every write (kopf waits for its own patches to come back by it), a generation
    bumped by spec changes, names for `generateName` (kopf's events), 422 for a failed
    JSON-patch test; and the core group's discovery document the way kubectl expects it."""

    _versions = itertools.count(1)
    served = 0  # requests answered, also when the log below is trimmed
    # kmock logs every request and matches each new one against its reactions by scanning
    # that whole log (O(n) per request); nothing here reads the log, so keep it short.
    keep_requests: int | None = 10

    async def _handle(self, request: Any) -> Any:
        self.served += 1
        if self.keep_requests is not None and len(self._requests) > 2 * self.keep_requests:
            del self._requests[: -self.keep_requests]
        if request.action == kmock.action.CREATE and isinstance(request.data, dict):
            meta = request.data.setdefault("metadata", {})
            if "name" not in meta and "generateName" in meta:
                meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
            meta.setdefault("uid", str(uuid.uuid4()))
            meta["resourceVersion"] = str(next(self._versions))
            meta.setdefault("generation", 1)
            meta.setdefault(
                "creationTimestamp",
                datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            )
        elif request.action == kmock.action.UPDATE and request.name is not None:
            version = str(next(self._versions))
            if isinstance(request.data, dict):  # merge patch
                meta = request.data.setdefault("metadata", {})
                meta["resourceVersion"] = version
                if "spec" in request.data and "generation" not in meta:
                    meta["generation"] = self._generation(request) + 1
            elif isinstance(request.data, list):  # JSON patch (kopf's, after its test op)
                request.data.append(
                    {"op": "add", "path": "/metadata/resourceVersion", "value": version}
                )
        try:
            return await super()._handle(request)
        except jsonpatch.JsonPatchTestFailed as exc:
            # kube-apiserver answers a failed `test` op (kopf's stale resourceVersion) with
            # 422, which kopf treats as "retry on the next event", not as a crash.
            raise kmock.KubernetesError(status=422, reason="Invalid", message=str(exc)) from exc

    def _generation(self, request: Any) -> int:
        key = (request.resource, request.namespace, request.name)
        raw = self._objects[key].raw if key in self._objects else {}
        return int((raw.get("metadata") or {}).get("generation") or 0)

    async def _serve_version(self, request: Any) -> Any:
        # kmock answers /api/v1 with groupVersion "/v1"; the core group's is "v1".
        payload = await super()._serve_version(request)
        if isinstance(payload, dict) and payload.get("groupVersion", "").startswith("/"):
            payload["groupVersion"] = payload["groupVersion"][1:]
        return payload


@dataclass
class Cluster:
    emulator: Emulator
    api: httpx.AsyncClient

    async def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        r = await self.api.post(path, json=body)
        assert r.status_code in (200, 201), r.text
        return dict(r.json())

    async def get(self, path: str) -> dict[str, Any] | None:
        r = await self.api.get(path)
        return None if r.status_code == 404 else dict(r.json())

    async def merge(self, path: str, body: dict[str, Any]) -> None:
        r = await self.api.patch(
            path, json=body, headers={"Content-Type": "application/merge-patch+json"}
        )
        assert r.status_code == 200, r.text

    async def delete(self, path: str) -> None:
        r = await self.api.delete(path)
        assert r.status_code == 200, r.text

    def events(self) -> list[dict[str, Any]]:
        return [
            obj.raw
            for (resource, _, _), obj in self.emulator.objects.items()
            if resource.plural == "events"
        ]


async def wait_for(predicate: Any, timeout: float = 60.0, what: str = "condition") -> Any:
    """Poll an async predicate until it returns something truthy."""
    deadline = asyncio.get_running_loop().time() + timeout
    last = None
    while asyncio.get_running_loop().time() < deadline:
        last = await predicate()
        if last:
            return last
        await asyncio.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}; last: {last!r}")
