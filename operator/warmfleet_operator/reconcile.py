"""The pure reconcile core: a WarmPromptSet, the WarmNodes and what each daemon
reports in; what to push, what to remove, and the status to write out. No I/O."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import yaml
from pydantic import ValidationError

from warmfleet_common.agent_apis.shapes import SHAPES
from warmfleet_common.contract import PEER_URL, PromptState, WarmSetSpec, WarmSetStatus
from warmfleet_common.crd import Node, SetKey
from warmfleet_operator.objects import InvalidSpec, Observation, Push, Remove

ConfigMaps = Mapping[tuple[str, str], Mapping[str, str]]  # (namespace, name) -> data

# What the CRD allows a whole set (its CEL rule), so that spec and status stay under the
# API server's 1.5 MiB per object; sets that grow past it through ConfigMaps are refused.
MAX_SET_CHARS = 524_288
MAX_STATUS_NODES = 256  # the CRD's status.nodes maxItems
MAX_ERROR_CHARS = 1024  # the CRD's status.nodes[].error maxLength
MAX_PEERS = 8  # WarmSetSpec.peers' max_length


# -- selection ----------------------------------------------------------------------


def matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """Kubernetes label-selector semantics (matchLabels AND matchExpressions)."""
    if not selector:
        return True
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        present = key in labels
        if op == "In" and not (present and labels[key] in values):
            return False
        if op == "NotIn" and present and labels[key] in values:
            return False
        if op == "Exists" and not present:
            return False
        if op == "DoesNotExist" and present:
            return False
    return True


def select_nodes(
    selector: Mapping[str, Any] | None, nodes: Iterable[Node], model: str | None = None
) -> list[Node]:
    """The nodes a set targets, by name. A model filter skips nodes known to serve
    another model (a node not probed yet is kept: the push tells)."""
    chosen = [
        n
        for n in nodes
        if matches(selector, n.labels) and (not model or n.model is None or n.model == model)
    ]
    return sorted(chosen, key=lambda n: n.name)


# -- the desired state ----------------------------------------------------------------


# A prompt's ConfigMap references, one per API shape: the field naming the key -> the
# field its content fills (a list of chat messages, or an agent API's prompt object).
SOURCES = {s.configmap_field: s.prompt_field for s in SHAPES.values()}


def referenced_configmaps(spec: Mapping[str, Any]) -> set[str]:
    return {
        p[source]["configMapKeyRef"]["name"]
        for p in spec.get("prompts") or []
        for source in SOURCES
        if p.get(source)
    }


def resolve(
    spec: Mapping[str, Any],
    namespace: str,
    generation: int,
    configmaps: ConfigMaps,
    uid: str | None = None,
    learned: Sequence[Mapping[str, Any]] = (),
) -> WarmSetSpec:
    """The push body for a WarmPromptSet spec, ConfigMap references resolved; the
    prompts' shapes (chat messages, `anthropic`, `responses`) pass through unchanged,
    and the `learned` prompts (a learning set's: `learned.select`) follow its own.
    Raises InvalidSpec (reason ConfigMapMissing, ConfigMapInvalid or InvalidSpec)."""
    prompts = []
    for prompt in spec.get("prompts") or []:
        item = {k: v for k, v in prompt.items() if k not in SOURCES}
        for source, field in SOURCES.items():
            if prompt.get(source):
                text = _configmap_value(
                    prompt[source]["configMapKeyRef"], prompt, namespace, configmaps
                )
                item[field] = _parse(
                    text, field, prompt.get("name"), prompt[source]["configMapKeyRef"]
                )
        prompts.append(item)
    prompts += [dict(p) for p in learned]
    body = {
        "generation": generation,
        "uid": uid,
        "prompts": prompts,
        "concurrency": spec.get("concurrency", 2),
        "pin": spec.get("pin", True),
    }
    if spec.get("tenants"):  # scoped to these tenants' caches; none: fleet-wide, shared
        body["tenants"] = list(spec["tenants"])
    size = _set_chars(prompts)
    if size > MAX_SET_CHARS:
        raise InvalidSpec(
            "TooLarge",
            f"the prompts hold {size} characters of message contents, system prompts and tool "
            "descriptions; "
            f"a set may hold at most {MAX_SET_CHARS}",
        )
    body["source_hash"] = _hash(body | {"generation": None, "uid": None})
    try:
        return WarmSetSpec.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise InvalidSpec("InvalidSpec", f"{where}: {first['msg']}") from exc


def _configmap_value(
    ref: Mapping[str, str], prompt: Mapping[str, Any], namespace: str, configmaps: ConfigMaps
) -> str:
    data = configmaps.get((namespace, ref["name"]))
    if data is None:
        raise InvalidSpec(
            "ConfigMapMissing",
            f"prompt {prompt.get('name')!r}: ConfigMap {namespace}/{ref['name']} not found",
        )
    if ref["key"] not in data:
        raise InvalidSpec(
            "ConfigMapMissing",
            f"prompt {prompt.get('name')!r}: ConfigMap {namespace}/{ref['name']} "
            f"has no key {ref['key']!r}",
        )
    return data[ref["key"]]


def _set_chars(prompts: Iterable[Mapping[str, Any]]) -> int:
    """Characters the CRD's size rule counts: message contents, system prompts and tool
    descriptions."""
    total = 0
    for prompt in prompts:
        total += _contents(prompt.get("messages"))
        total += _descriptions(t.get("function") for t in _dicts(prompt.get("tools")))
        agent = _dict(prompt.get("anthropic"))
        total += _chars(agent.get("system")) + _contents(agent.get("messages"))
        total += _descriptions(_dicts(agent.get("tools")))
        agent = _dict(prompt.get("responses"))
        total += _chars(agent.get("instructions")) + _contents(agent.get("input"))
        tools = _dicts(agent.get("tools"))
        total += _descriptions(tools) + _descriptions(
            u for t in tools for u in _dicts(t.get("tools"))
        )
    return total


def _contents(messages: Any) -> int:
    return sum(_chars(m.get("content")) for m in _dicts(messages))


def _descriptions(tools: Iterable[Any]) -> int:
    return sum(len(str(_dict(t).get("description") or "")) for t in tools)


def _chars(text: Any) -> int:
    if text is None:
        return 0
    return len(text) if isinstance(text, str) else len(json.dumps(text, default=str))


def _dict(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _dicts(values: Any) -> list[Mapping[str, Any]]:
    return [v for v in values if isinstance(v, Mapping)] if isinstance(values, list) else []


def _parse(text: str, field: str, prompt: str | None, ref: Mapping[str, str]) -> Any:
    """A ConfigMap value: a list of messages (`messages`), or the API's prompt object
    (`anthropic`, `responses`), in JSON or YAML."""
    where = f"prompt {prompt!r}: {ref['name']}/{ref['key']}"
    try:
        value = yaml.safe_load(text)  # YAML is a superset of JSON
    except yaml.YAMLError as exc:
        raise InvalidSpec("ConfigMapInvalid", f"{where}: {exc}") from exc
    if field == "messages" and not isinstance(value, list):
        raise InvalidSpec("ConfigMapInvalid", f"{where} must hold a list of messages")
    if field != "messages" and not isinstance(value, dict):
        raise InvalidSpec(
            "ConfigMapInvalid",
            f"{where} must hold the {field} prompt object (what a warm-prompts entry "
            f"has under `{field}:`), in JSON or YAML",
        )
    return value


# -- actions --------------------------------------------------------------------------


def plan(
    desired: WarmSetSpec,
    selected: Sequence[Node],
    observations: Mapping[str, Observation],
    holders: Iterable[Node],
) -> tuple[list[Push], list[Remove]]:
    """Push to selected nodes that lack the set or hold an older version of it;
    remove it from nodes that hold it but are no longer selected. A node holding a
    newer generation of the same object is left alone: this pass saw a stale body.
    Each push names as `peers` the other selected nodes already warm for this content,
    so the node copies their KV blocks instead of prefilling."""
    pushes = []
    for node in selected:
        seen = observations.get(node.name)
        if seen is None or not seen.reachable:
            continue  # retried at the next resync
        if _outdated(seen.status, desired):
            peers = warm_peers(node, desired, selected, observations)
            by_url = {n.url: n for n in selected}
            pushes.append(
                Push(
                    node,
                    desired.model_copy(update={"peers": peers}),
                    tuple(by_url[url] for url in peers),
                )
            )
    chosen = {n.name for n in selected}
    removes = [Remove(n) for n in holders if n.name not in chosen]
    return pushes, removes


def warm_peers(
    node: Node,
    desired: WarmSetSpec,
    selected: Sequence[Node],
    observations: Mapping[str, Observation],
) -> list[str]:
    """URLs of the other selected nodes whose status shows every prompt of this content
    warm (same source hash), at most MAX_PEERS, by node name. Not part of `_outdated` nor
    of the source hash: a peer turning warm or cold never causes a push by itself."""
    urls: list[str] = []
    for peer in selected:
        if peer.name == node.name or peer.url == node.url or peer.url in urls:
            continue
        if node.model and peer.model and node.model != peer.model:
            continue  # another model's KV is useless (the daemon would refuse it anyway)
        seen = observations.get(peer.name)
        status = seen.status if seen is not None and seen.reachable else None
        if (
            status is not None
            and status.source_hash is not None
            and status.source_hash == desired.source_hash
            and status.total > 0
            and status.warm == status.total
            # A URL the contract refuses would get the whole push refused.
            and len(peer.url) <= 2048
            and re.fullmatch(PEER_URL, peer.url) is not None
        ):
            urls.append(peer.url)
    return urls[:MAX_PEERS]


def _outdated(have: WarmSetStatus | None, desired: WarmSetSpec) -> bool:
    if have is None or have.uid != desired.uid or have.generation < desired.generation:
        return True
    # A ConfigMap edit changes what resolves without bumping the generation.
    return have.generation == desired.generation and have.source_hash != desired.source_hash


# -- status ---------------------------------------------------------------------------


def node_entry(node: Node, seen: Observation | None, now: str) -> dict[str, Any]:
    """One status.nodes item. Fields without a value are left out, never null: the API
    server prunes nulls, and a status that differs from what was written is rewritten."""
    entry: dict[str, Any] = {"node": node.name, "url": node.url, "lastSync": now}
    status = seen.status if seen is not None and seen.reachable else None
    if status is None:
        error = (seen.error if seen else None) or ("not probed yet" if seen is None else None)
        entry.update(warm=0, total=0, tokens=0)
    else:
        failed = [p for p in status.prompts if p.state is PromptState.FAILED]
        entry.update(
            warm=status.warm,
            total=status.total,
            tokens=sum(p.tokens for p in status.prompts if p.state is PromptState.WARM),
            generation=status.generation,
        )
        prompt_errors = "; ".join(f"{p.name}: {p.error}" for p in failed)
        error = (seen.error if seen is not None and seen.rejected else None) or prompt_errors
    if error:
        entry["error"] = error[:MAX_ERROR_CHARS]
    return entry


def set_status(
    *,
    generation: int,
    selected: Sequence[Node],
    observations: Mapping[str, Observation],
    desired: WarmSetSpec | None,
    invalid: InvalidSpec | None,
    previous: Sequence[Mapping[str, Any]],
    now: str,
    learning: bool = False,
) -> dict[str, Any]:
    """The WarmPromptSet status: per node entries and Ready/Progressing/Degraded
    (`learning`: a set filled by the router's learned prompts, maybe none yet)."""
    nodes = [node_entry(n, observations.get(n.name), now) for n in selected]
    current = [
        e
        for e in nodes
        if desired is not None and _is_current(observations.get(e["node"]), desired)
    ]
    # A learning set with nothing learned yet is warm where a node holds it as it is.
    empty = learning and desired is not None and not desired.prompts
    warm_nodes = sum(1 for e in current if (e["total"] or empty) and e["warm"] == e["total"])
    unreachable = [n.name for n in selected if not _reachable(observations.get(n.name))]
    rejected = [n.name for n in selected if _rejected(observations.get(n.name))]
    refused = [n.name for n in selected if _unauthorized(observations.get(n.name))]
    failed = [
        e["node"]
        for e in nodes
        if e.get("error") and e["node"] not in {*unreachable, *rejected, *refused}
    ]

    if invalid is not None:
        ready = ("False", invalid.reason, invalid.message)
        progressing = ("False", invalid.reason, "nothing pushed until the spec is fixed")
        degraded = ("True", invalid.reason, invalid.message)
    elif not selected:
        ready = ("False", "NoNodes", "no WarmNode matches the node selector")
        progressing = ("False", "NoNodes", "no WarmNode matches the node selector")
        degraded = ("False", "NoNodes", "no WarmNode matches the node selector")
    else:
        total = len(selected)
        if warm_nodes == total and empty:
            said = "no prompt learned yet: the router has seen no static head from enough sessions"
            ready = ("True", "NothingLearned", f"{said} ({total}/{total} nodes hold the set)")
        elif warm_nodes == total:
            ready = ("True", "AllWarm", f"every prompt is warm on {total}/{total} nodes")
        elif unreachable:
            ready = ("False", "NodesUnreachable", f"unreachable: {', '.join(unreachable)}")
        elif refused:
            ready = (
                "False",
                "Unauthorized",
                f"admin token refused or missing: {', '.join(refused)}",
            )
        elif rejected:
            ready = ("False", "PushRejected", f"rejected by: {', '.join(rejected)}")
        elif failed:
            ready = ("False", "WarmUpFailed", f"prompts failed on: {', '.join(failed)}")
        else:
            ready = ("False", "Warming", f"{warm_nodes}/{total} nodes warm")
        busy = warm_nodes < total and not (unreachable or failed or rejected or refused)
        progressing = (
            ("True", "Warming", f"{warm_nodes}/{total} nodes warm")
            if busy
            else ("False", ready[1], ready[2])
        )
        if unreachable:
            degraded = ("True", "NodesUnreachable", f"unreachable: {', '.join(unreachable)}")
        elif refused:
            degraded = (
                "True",
                "Unauthorized",
                "; ".join(f"{e['node']}: {e['error']}" for e in nodes if e["node"] in refused),
            )
        elif rejected:
            degraded = (
                "True",
                "PushRejected",
                "; ".join(f"{e['node']}: {e['error']}" for e in nodes if e["node"] in rejected),
            )
        elif failed:
            degraded = (
                "True",
                "WarmUpFailed",
                "; ".join(e["error"] for e in nodes if e.get("error")),
            )
        else:
            degraded = ("False", "AsExpected", "all selected nodes reachable")
    conditions = [
        _condition("Ready", ready, generation, previous, now),
        _condition("Progressing", progressing, generation, previous, now),
        _condition("Degraded", degraded, generation, previous, now),
    ]
    return {
        "observedGeneration": generation,
        "warmNodes": f"{warm_nodes}/{len(selected)}",
        "nodes": nodes[:MAX_STATUS_NODES],
        "conditions": conditions,
    }


_HEARTBEATS = frozenset({"lastSync", "lastProbe"})


def changed(old: Any, new: Any) -> bool:
    """Whether a status differs in more than its heartbeat timestamps: writing only
    then keeps the API server from a stream of no-op patches."""
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        keys = (set(old) | set(new)) - _HEARTBEATS
        return any(changed(old.get(k), new.get(k)) for k in keys)
    if isinstance(old, list) and isinstance(new, list):
        return len(old) != len(new) or any(changed(a, b) for a, b in zip(old, new))
    return bool(old != new)


def condition(status: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    return next((c for c in status.get("conditions") or [] if c.get("type") == kind), None)


def _condition(
    kind: str,
    value: tuple[str, str, str],
    generation: int,
    previous: Sequence[Mapping[str, Any]],
    now: str,
) -> dict[str, Any]:
    status, reason, message = value
    before = next((c for c in previous if c.get("type") == kind), None)
    changed = before is None or before.get("status") != status
    return {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": message[:4096],
        "observedGeneration": generation,
        "lastTransitionTime": now if changed else before.get("lastTransitionTime", now),  # type: ignore[union-attr]
    }


def _reachable(seen: Observation | None) -> bool:
    return seen is not None and seen.reachable


def _rejected(seen: Observation | None) -> bool:
    return seen is not None and seen.rejected


def _unauthorized(seen: Observation | None) -> bool:
    return seen is not None and seen.unauthorized


def _is_current(seen: Observation | None, desired: WarmSetSpec) -> bool:
    return (
        seen is not None
        and seen.status is not None
        and seen.status.source_hash == desired.source_hash
    )


def _hash(value: object) -> str:
    return hashlib.blake2b(json.dumps(value, sort_keys=True).encode(), digest_size=12).hexdigest()


def describe(
    key: SetKey,
    pushes: Sequence[Push],
    removes: Sequence[Remove],
    failed: Mapping[str, str] | None = None,
) -> str:
    """One log line: where the set went, and where a push failed and why."""
    failed = failed or {}
    parts = []
    done = [p.node.name for p in pushes if p.node.name not in failed]
    if done:
        parts.append("pushed to " + ", ".join(done))
    if failed:
        parts.append("push failed on " + "; ".join(f"{n} ({why})" for n, why in failed.items()))
    if removes:
        parts.append("removed from " + ", ".join(r.node.name for r in removes))
    return f"{key}: " + ("; ".join(parts) if parts else "in sync")
