"""Where kopf keeps what it last handled of an object: digests instead of copies."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any, cast

import kopf

from warmfleet_common.crd import GROUP


class DigestDiffBase(kopf.AnnotationsDiffBaseStorage):
    """kopf's diff base as digests: kopf's default copies the whole spec into an
    annotation, which fails for specs over ~128 KiB (annotations total 256 KiB, and
    kubectl apply keeps a copy too). Handlers here read the new body, never `old` or
    `diff`, so a digest per section says all they need: whether it changed."""

    LEGACY = "kopf.zalando.org/last-handled-configuration"

    def __init__(self) -> None:
        super().__init__(prefix=GROUP, key="last-handled-digest")

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        digests = super().fetch(body=body)
        if digests is None:
            return None
        current = _sections(self.build(body=body))
        old: dict[str, Any] = {}
        for path, digest in dict(digests).items():
            value = current.get(path)
            _put(old, path, value if _digest(value) == digest else {"digest": digest})
        return cast(kopf.BodyEssence, old)

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        digests = {path: _digest(value) for path, value in _sections(essence).items()}
        super().store(body=body, patch=patch, essence=cast(kopf.BodyEssence, digests))
        if self.LEGACY in body.metadata.annotations:
            patch.metadata.annotations[self.LEGACY] = None  # the full copy it replaces


def _sections(essence: Mapping[str, Any]) -> dict[str, Any]:
    """Top-level fields, and metadata's (labels, annotations) one by one."""
    out: dict[str, Any] = {}
    for key, value in essence.items():
        if key == "metadata" and isinstance(value, Mapping):
            out.update({f"metadata.{k}": v for k, v in value.items()})
        else:
            out[key] = value
    return out


def _put(target: dict[str, Any], path: str, value: Any) -> None:
    head, _, rest = path.partition(".")
    if rest:
        target.setdefault(head, {})[rest] = value
    else:
        target[head] = value


def _digest(value: Any) -> str:
    raw = json.dumps(value, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.blake2b(raw, digest_size=16).hexdigest()
