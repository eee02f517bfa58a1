"""A folder of Kubernetes YAML (WarmNodes, WarmPromptSets, ConfigMaps, Secrets) read as
a cluster without an API server would hold it: what `warmfleet operator --local DIR`
reconciles and `warmfleet router --local DIR` discovers daemons from."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from warmfleet_common.crd import GROUP, SetKey
from warmfleet_common.kube import secret_data


@dataclass
class Folder:
    """Everything the folder declares, by kind."""

    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    sets: dict[SetKey, dict[str, Any]] = field(default_factory=dict)
    configmaps: dict[tuple[str, str], dict[str, str]] = field(default_factory=dict)
    secrets: dict[tuple[str, str], dict[str, str]] = field(default_factory=dict)
    generations: dict[SetKey, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


# libyaml's loader where PyYAML has it: a hundred WarmNodes parse ten times faster.
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def read_folder(directory: Path) -> Folder:
    folder = Folder()
    for path in sorted(directory.glob("*.y*ml")):
        try:
            documents = [d for d in yaml.load_all(path.read_text(), Loader=_LOADER) if d]
        except (OSError, yaml.YAMLError) as exc:
            folder.errors.append(f"{path.name}: {exc}")
            continue
        for doc in documents:
            _add(folder, doc, path)
    return folder


def folder_stamp(directory: Path) -> tuple[tuple[str, int, int], ...]:
    """What changes when a file of the folder does (names, sizes, modification times):
    a poller reads the folder again only then."""
    stamps = []
    for path in sorted(directory.glob("*.y*ml")):
        try:
            info = path.stat()
        except OSError:  # gone meanwhile
            continue
        stamps.append((path.name, info.st_size, info.st_mtime_ns))
    return tuple(stamps)


def _add(folder: Folder, doc: Any, path: Path) -> None:
    if not isinstance(doc, dict) or "kind" not in doc:
        folder.errors.append(f"{path.name}: a document without a kind")
        return
    kind, meta = doc["kind"], doc.get("metadata") or {}
    name, namespace = meta.get("name"), meta.get("namespace") or "default"
    if not name:
        folder.errors.append(f"{path.name}: a {kind} without metadata.name")
    elif kind == "WarmNode" and doc.get("apiVersion", "").startswith(GROUP):
        folder.nodes[name] = doc
    elif kind == "WarmPromptSet" and doc.get("apiVersion", "").startswith(GROUP):
        key = SetKey(namespace, name)
        folder.sets[key] = doc
        # No API server counts generations here: the file's age stands in, it grows on edit.
        folder.generations[key] = int(path.stat().st_mtime)
    elif kind == "ConfigMap":
        folder.configmaps[(namespace, name)] = {
            k: str(v) for k, v in (doc.get("data") or {}).items()
        }
    elif kind == "Secret":
        folder.secrets[(namespace, name)] = secret_data(doc)
    else:
        folder.errors.append(f"{path.name}: {kind} {name} is not used in local mode")
