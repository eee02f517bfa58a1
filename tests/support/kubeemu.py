"""kmock's Kubernetes emulator, made a little more like kube-apiserver, and helpers
for tests that drive the operator through it."""

from __future__ import annotations

import asyncio
import collections
import copy
import datetime
import itertools
import json
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import jsonpatch
import jsonschema
import kmock
import yaml
from kmock._internal import aiobus  # the bus kmock's watches read: recorded for resumed watches

CRDS = Path(__file__).resolve().parents[2] / "crds"
MAX_ANNOTATIONS_BYTES = 262_144  # kube-apiserver: metadata.annotations in total
MAX_OBJECT_BYTES = 1_572_864  # etcd's default --max-request-bytes (1.5 MiB)
WATCH_HISTORY = 1000  # events kept per resource for watches resumed from a resourceVersion

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


def crd_schemas() -> dict[str, dict[str, Any]]:
    """plural -> the openAPIV3Schema of its served version, from crds/."""
    out = {}
    for path in sorted(CRDS.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        version = next(v for v in crd["spec"]["versions"] if v.get("storage"))
        out[crd["spec"]["names"]["plural"]] = version["schema"]["openAPIV3Schema"]
    return out


class Emulator(kmock.KubernetesEmulator):
    """kmock's emulator plus what kube-apiserver does and kopf relies on: a uid on
    creation (kopf keys its per-object state by it), a resourceVersion that changes
    on every write (kopf waits for its own patches to come back by it), a generation
    bumped by spec changes, names for `generateName` (kopf's events), 422 for a failed
    JSON-patch test; and the core group's discovery document the way kubectl expects it.

    Custom resources go through their CRD's structural schema as on a real server:
    unknown fields and nulls pruned, defaults applied, keys sorted, the schema validated
    (422), the status subresource (writes to the object ignore status, writes to /status
    change only status), annotations over 256 KiB refused (422) and objects over etcd's
    1.5 MiB refused (413). (kmock itself keeps an object with finalizers until they
    are removed: a delete only sets deletionTimestamp.) CEL rules are not evaluated.

    Lists and watches follow resourceVersions as kube-apiserver's watch cache does: a
    LIST carries the current resourceVersion; a watch from a resourceVersion replays
    the events after it (every event carries a new one, deletions too), or, when that
    history is gone (`compact()`, or more than WATCH_HISTORY events since), sends one
    ERROR event with a 410 Expired Status; a watch without one (or "0") starts with
    ADDED for every object; `timeoutSeconds` ends the stream."""

    schemas: dict[str, dict[str, Any]] = crd_schemas()

    _versions = itertools.count(1)
    served = 0  # requests answered, also when the log below is trimmed
    # kmock logs every request and matches each new one against its reactions by scanning
    # that whole log (O(n) per request); nothing here reads the log, so keep it short.
    keep_requests: int | None = 10

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        # resource -> (resourceVersion, event) after the last compaction, oldest first
        self._history: dict[Any, collections.deque[tuple[int, dict[str, Any]]]] = {}
        self._expired: dict[Any, int] = {}  # resource -> newest resourceVersion forgotten
        self._compacted = 0  # etcd's compaction: no watch resumes from before this version
        self._last_version = 0
        self.expired_watches = 0  # watches answered with 410 Expired
        self._buses = _RecordingBuses(self._record)

    def _record(self, resource: Any, event: Any) -> Any:
        """Called (under kmock's lock) for each event kmock publishes: give it the
        resourceVersion kube-apiserver would (a new one for a deletion) and keep it."""
        if not isinstance(event, dict) or not isinstance(event.get("object"), dict):
            return event
        event = {**event, "object": copy.deepcopy(event["object"])}
        meta = _meta(event["object"])
        try:
            version = int(meta.get("resourceVersion") or 0)
        except ValueError:
            version = 0
        if version <= self._last_version:
            version = next(self._versions)
            meta["resourceVersion"] = str(version)
        self._last_version = version
        history = self._history.setdefault(resource, collections.deque())
        history.append((version, event))
        while len(history) > WATCH_HISTORY:
            self._expired[resource] = history.popleft()[0]
        return event

    def compact(self) -> None:
        """Forget every event so far (etcd's compaction, for every resource): watches
        resumed from an older resourceVersion get 410 Expired and must list again."""
        self._compacted = next(self._versions)
        for history in self._history.values():
            history.clear()

    async def _serve_list(self, request: Any) -> Any:
        version = next(self._versions)  # every change recorded so far is in the items
        payload = await super()._serve_list(request)
        if isinstance(payload, dict):
            payload["metadata"] = {"resourceVersion": str(version)}
        return payload

    async def _serve_watch(self, request: Any) -> AsyncIterator[Any]:
        since = str(request.params.get("resourceVersion") or "")
        timeout = request.params.get("timeoutSeconds")
        deadline = None
        if timeout:
            deadline = asyncio.get_running_loop().time() + float(timeout)
        if since in ("", "0"):  # "any": the current objects as ADDED, then changes
            async for item in _until(super()._serve_watch(request), deadline):
                yield item
            return
        yield b""  # the headers go out at once, as kmock's own watch does
        if not since.isdigit():
            yield _status_event(400, "BadRequest", f"invalid resourceVersion {since!r}")
            return
        bus = self._buses[request.resource]
        async with self._lock:  # the same lock kmock publishes under: nothing falls between
            expired = max(self._compacted, self._expired.get(request.resource, 0))
            if int(since) < expired:
                backlog = None
            else:
                backlog = [
                    e
                    for v, e in self._history.get(request.resource, ())
                    if v > int(since) and _watched(request, e)
                ]
                marker = await bus.mark()
        if backlog is None:
            self.expired_watches += 1
            yield _status_event(410, "Expired", f"too old resource version: {since}")
            return
        try:
            for event in backlog:
                yield event
            live = (e async for e in bus.stream(since=marker) if _watched(request, e))
            async for event in _until(live, deadline):
                yield event
        finally:
            await bus.unmark(marker)

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
        elif request.action == kmock.action.DELETE and request.name is not None:
            # A delete held by finalizers is a write (deletionTimestamp): a new version on
            # the stored object too, or kopf's optimistic patches against it would fail.
            key = (request.resource, request.namespace, request.name)
            stored = self._objects[key] if key in self._objects else None  # noqa: SIM401
            meta = {} if stored is None or stored.deleted else _meta(copy.deepcopy(stored.raw))
            if meta.get("finalizers") and not meta.get("deletionTimestamp"):
                stored.patch({"metadata": {"resourceVersion": str(next(self._versions))}})
        try:
            if request.action in (kmock.action.CREATE, kmock.action.UPDATE):
                self._admit(request)
            return await super()._handle(request)
        except jsonpatch.JsonPatchTestFailed as exc:
            # kube-apiserver answers a failed `test` op (kopf's stale resourceVersion) with
            # 422, which kopf treats as "retry on the next event", not as a crash.
            raise kmock.KubernetesError(status=422, reason="Invalid", message=str(exc)) from exc

    def _admit(self, request: Any) -> None:
        """Compute the object this write would store, shape and check it like the real
        server, and hand kmock the merge patch (or body) that stores exactly that."""
        if request.resource is None or not isinstance(request.data, (dict, list)):
            return
        if request.action == kmock.action.UPDATE and request.name is None:
            return
        schema = self.schemas.get(request.resource.plural)
        if request.action == kmock.action.CREATE:
            meta = request.data.get("metadata") or {}
            key = (request.resource, request.namespace or meta.get("namespace"), meta.get("name"))
        else:
            key = (request.resource, request.namespace, request.name)
        stored = self._objects[key] if key in self._objects else None  # noqa: SIM401 (no .get)
        current = None if stored is None or stored.deleted else copy.deepcopy(stored.raw)
        if request.action == kmock.action.CREATE or current is None:
            result = copy.deepcopy(request.data)
        elif isinstance(request.data, list):
            result = jsonpatch.apply_patch(current, request.data, in_place=False)
        else:
            result = _merge(current, request.data)
        if schema is not None:
            if request.subresource == "status" and current is not None:
                version = _meta(result).get("resourceVersion")
                result = {**current, "status": result.get("status")}
                result["metadata"] = {**current["metadata"], "resourceVersion": version}
            elif current is not None:
                result["status"] = current.get("status")
            else:
                result.pop("status", None)
            if result.get("status") is None:
                result.pop("status", None)
            result = _structural(result, schema)
            _validate(request.resource, result, schema)
            if current is not None:
                generation = int(_meta(current).get("generation") or 1)
                changed = result.get("spec") != current.get("spec")
                result["metadata"]["generation"] = generation + 1 if changed else generation
        _check_sizes(request.resource, result)
        new = result if current is None else _merge_patch(current, result)
        object.__setattr__(request, "data", new)

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


class _RecordingBus(aiobus.Bus[Any]):
    """kmock's per-resource event bus, each event first given to `record`."""

    record: Callable[[Any], Any]

    async def put(self, *items: Any) -> None:
        await super().put(*(self.record(item) for item in items))


class _RecordingBuses(dict[Any, _RecordingBus]):
    def __init__(self, record: Callable[[Any, Any], Any]) -> None:
        super().__init__()
        self._record = record

    def __missing__(self, resource: Any) -> _RecordingBus:
        bus = _RecordingBus()
        bus.record = lambda event: self._record(resource, event)
        self[resource] = bus
        return bus


def _watched(request: Any, event: Any) -> bool:
    """Whether a watch of this request's namespace and name sees this event."""
    meta = (event.get("object") or {}).get("metadata") or {} if isinstance(event, dict) else {}
    return (request.namespace is None or meta.get("namespace") == request.namespace) and (
        request.name is None or meta.get("name") == request.name
    )


def _status_event(code: int, reason: str, message: str) -> dict[str, Any]:
    """A watch's ERROR event, as kube-apiserver sends it (a Status object)."""
    status = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure"}
    return {
        "type": "ERROR",
        "object": {**status, "message": message, "reason": reason, "code": code},
    }


async def _until(items: AsyncIterator[Any], deadline: float | None) -> AsyncIterator[Any]:
    """`items` until `deadline` (the loop's clock), as `timeoutSeconds` ends a watch."""
    iterator = aiter(items)
    loop = asyncio.get_running_loop()
    try:
        while True:
            if deadline is None:
                item = await anext(iterator)
            else:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return
                try:
                    item = await asyncio.wait_for(anext(iterator), remaining)
                except asyncio.TimeoutError:
                    return
            yield item
    except StopAsyncIteration:
        return
    finally:
        close = getattr(iterator, "aclose", None)
        if close is not None:
            await close()


def _meta(obj: dict[str, Any]) -> dict[str, Any]:
    return obj.setdefault("metadata", {})  # type: ignore[no-any-return]


def _merge(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = _merge(out.get(key), value)
    return out


def _merge_patch(old: Any, new: Any) -> Any:
    """The merge patch that turns `old` into `new` (kmock applies merge patches)."""
    if not (isinstance(old, dict) and isinstance(new, dict)):
        return copy.deepcopy(new)
    patch: dict[str, Any] = {k: None for k in old if k not in new}
    for key, value in new.items():
        if key not in old or old[key] != value:
            patch[key] = _merge_patch(old.get(key), value)
    return patch


_DROP = object()


def _structural(value: Any, schema: dict[str, Any]) -> Any:
    """Pruning and defaulting as kube-apiserver does with a structural schema: fields
    the schema does not name are dropped (unless x-kubernetes-preserve-unknown-fields),
    so are nulls (unless nullable); missing fields with a default get it; and object
    keys come back sorted (the server holds custom objects as Go maps, which encoding/json
    writes in key order)."""
    if value is None:
        return None if schema.get("nullable") else _DROP
    if isinstance(value, dict) and (schema.get("type") == "object" or "properties" in schema):
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        keep_unknown = schema.get("x-kubernetes-preserve-unknown-fields") or (
            props is None and not isinstance(extra, dict)
        )
        out = {}
        for key, item in value.items():
            if props is not None and key in props:
                sub = props[key]
            elif isinstance(extra, dict):
                sub = extra
            elif keep_unknown:
                out[key] = _sorted_keys(item)
                continue
            else:
                continue
            shaped = _structural(item, sub)
            if shaped is not _DROP:
                out[key] = shaped
        for key, sub in (props or {}).items():
            if key not in out and "default" in sub:
                out[key] = copy.deepcopy(sub["default"])
        return {key: out[key] for key in sorted(out)}
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [
            shaped for item in value if (shaped := _structural(item, schema["items"])) is not _DROP
        ]
    return value


def _sorted_keys(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _sorted_keys(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_sorted_keys(v) for v in value]
    return value


def _validate(resource: Any, obj: dict[str, Any], schema: dict[str, Any]) -> None:
    errors = sorted(
        jsonschema.Draft7Validator(schema).iter_errors(obj), key=lambda e: list(e.absolute_path)
    )
    if errors:
        name = _meta(obj).get("name")
        causes = "; ".join(
            f"{'.'.join(str(p) for p in e.absolute_path) or '<root>'}: {e.message}"
            for e in errors[:8]
        )
        raise kmock.KubernetesError(
            status=422,
            reason="Invalid",
            message=f"{resource.plural}.{resource.group} {name!r} is invalid: {causes}",
        )


def _check_sizes(resource: Any, obj: dict[str, Any]) -> None:
    annotations = _meta(obj).get("annotations") or {}
    size = sum(len(k.encode()) + len(str(v).encode()) for k, v in annotations.items())
    if size > MAX_ANNOTATIONS_BYTES:
        raise kmock.KubernetesError(
            status=422,
            reason="Invalid",
            message=f"metadata.annotations: Too long: must have at most "
            f"{MAX_ANNOTATIONS_BYTES} bytes (got {size})",
        )
    if len(json.dumps(obj).encode()) > MAX_OBJECT_BYTES:
        raise kmock.KubernetesError(
            status=413, reason="RequestEntityTooLarge", message="etcdserver: request is too large"
        )


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


def write_kubeconfig(path: Path, server: str, token: str | None = None) -> Path:
    """A kubeconfig with one context: `server`, with `token` or no credentials."""
    user = {"token": token} if token else {}
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "c",
                "clusters": [{"name": "c", "cluster": {"server": server}}],
                "users": [{"name": "u", "user": user}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
            }
        )
    )
    return path


@asynccontextmanager
async def emulated(folder: Path) -> AsyncIterator[tuple[Cluster, Path]]:
    """The emulator on a real port, taught our resources: a client for it and a
    kubeconfig for it (written in `folder`)."""
    async with Emulator() as emulator, kmock.Server(emulator):
        for key, info in RESOURCES.items():
            emulator.resources[key] = info
        url = str(emulator.url).rstrip("/")
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            yield Cluster(emulator, client), write_kubeconfig(folder / "kubeconfig", url)
