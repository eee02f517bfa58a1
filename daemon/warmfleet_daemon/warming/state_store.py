"""Pushed warm sets on disk (`--state-dir`), so a restarted daemon re-warms them
before the operator pushes again. Written atomically (temp file, fsync, rename, fsync
of the directory) and bounded in size. Reading never fails the daemon: a file that
cannot be parsed, is no regular file or exceeds the bound is moved aside whole, a set
that cannot be read is kept aside in a `warm-sets.rejected-*.json` file, and the
others are restored."""

from __future__ import annotations

import json
import logging
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from warmfleet_common.contract import DNS_LABEL, DNS_SUBDOMAIN, WarmSetSpec
from warmfleet_daemon.support.regular_files import read_regular

log = logging.getLogger(__name__)

FILE_NAME = "warm-sets.json"
FORMAT_VERSION = 1
DEFAULT_MAX_BYTES = 64 << 20

SetKey = tuple[str, str]


class StateTooLarge(ValueError):
    def __init__(self, size: int, limit: int) -> None:
        super().__init__(
            f"the warm-set state would take {size / 1e6:.1f} MB on disk; the limit is "
            f"{limit / 1e6:.1f} MB (--max-state-mb)"
        )


def invalid_key(namespace: object, name: object) -> str | None:
    """Why (namespace, name) is not one the warm-set routes accept, or None."""
    if not isinstance(namespace, str) or not re.fullmatch(DNS_LABEL, namespace):
        return f"namespace {namespace!r} is not a DNS label"
    if not isinstance(name, str) or len(name) > 253 or not re.fullmatch(DNS_SUBDOMAIN, name):
        return f"name {name!r} is not a DNS subdomain"
    return None


class StateStore:
    def __init__(self, directory: str | Path, *, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.path = self.directory / FILE_NAME
        self.max_bytes = max_bytes

    def check_writable(self) -> None:
        """Raise OSError unless files can be written in the directory."""
        fd, tmp = tempfile.mkstemp(prefix=".warm-sets-probe-", dir=self.directory)
        os.close(fd)
        os.unlink(tmp)

    def save(self, sets: dict[SetKey, WarmSetSpec]) -> None:
        """Write `sets`; raises StateTooLarge (nothing written) or OSError."""
        document = {
            "version": FORMAT_VERSION,
            "sets": [
                {"namespace": ns, "name": name, "spec": spec.model_dump(mode="json")}
                for (ns, name), spec in sorted(sets.items())
            ],
        }
        data = json.dumps(document, indent=1).encode()
        if len(data) > self.max_bytes:
            raise StateTooLarge(len(data), self.max_bytes)
        self._write(self.path, data)

    def load(self) -> dict[SetKey, WarmSetSpec]:
        """The saved sets that can be read; the others are kept aside (and logged)."""
        if not self.path.exists():
            return {}
        try:
            document = json.loads(read_regular(self.path, self.max_bytes))
            if not isinstance(document, dict) or document.get("version") != FORMAT_VERSION:
                version = document.get("version") if isinstance(document, dict) else None
                raise ValueError(f"not a version {FORMAT_VERSION} document (version {version!r})")
            items = document.get("sets")
            if not isinstance(items, list):
                raise ValueError("no list of sets")
        except (OSError, ValueError, RecursionError) as exc:  # RecursionError: deep nesting
            self._move_aside(f"unreadable: {type(exc).__name__}: {exc}"[:300])
            return {}
        sets: dict[SetKey, WarmSetSpec] = {}
        rejected: list[tuple[Any, str]] = []
        for item in items:
            try:
                if not isinstance(item, dict):
                    raise ValueError("not an object")
                namespace, name = item.get("namespace"), item.get("name")
                problem = invalid_key(namespace, name)
                if problem:
                    raise ValueError(problem)
                key = (str(namespace), str(name))
                if key in sets:
                    raise ValueError("saved twice")
                sets[key] = WarmSetSpec.model_validate(item.get("spec"))
            except (ValueError, ValidationError, RecursionError) as exc:
                rejected.append((item, f"{type(exc).__name__}: {exc}"[:500]))
        if rejected:
            self.keep_aside(rejected)
        return sets

    def keep_aside(self, rejected: list[tuple[Any, str]]) -> Path | None:
        """Write sets that cannot be restored, with why, to a file of their own: they
        are never silently lost when the state is next saved."""
        path = self.directory / f"warm-sets.rejected-{_stamp()}.json"
        data = json.dumps(
            {"sets": [{"reason": why, "item": item} for item, why in rejected]}, indent=1
        ).encode()
        try:
            self._write(path, data)
        except OSError as exc:
            log.error("could not keep %d unreadable warm set(s) aside: %s", len(rejected), exc)
            return None
        for item, why in rejected:
            label = f"{item.get('namespace')}/{item.get('name')}" if isinstance(item, dict) else "?"
            log.error("saved warm set %s not restored (%s): kept in %s", label, why, path)
        return path

    def _move_aside(self, why: str) -> None:
        aside = self.directory / f"{FILE_NAME}.unreadable-{_stamp()}"
        try:
            os.replace(self.path, aside)
        except OSError as exc:
            log.error("warm-set state %s is %s; could not move it aside: %s", self.path, why, exc)
            return
        log.error(
            "warm-set state %s is %s: moved to %s; starting without saved warm sets",
            self.path,
            why,
            aside,
        )

    def _write(self, path: Path, data: bytes) -> None:
        fd, tmp = tempfile.mkstemp(prefix=".warm-sets-", dir=self.directory)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        dir_fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def _stamp() -> str:
    return (
        time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + f"-{os.getpid()}-{time.time_ns() % 10**6}"
    )
