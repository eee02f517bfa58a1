"""Pushed warm sets on disk (`--state-dir`), so a restarted daemon re-warms them
before the operator pushes again. Written atomically (temp file, fsync, rename, fsync
of the directory); a corrupt or partial file is reported and ignored, never fatal."""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path

from pydantic import ValidationError

from warmfleet_daemon.contract import WarmSetSpec

log = logging.getLogger(__name__)

FILE_NAME = "warm-sets.json"
FORMAT_VERSION = 1


class StateStore:
    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.path = self.directory / FILE_NAME

    def save(self, sets: dict[tuple[str, str], WarmSetSpec]) -> None:
        document = {
            "version": FORMAT_VERSION,
            "sets": [
                {"namespace": ns, "name": name, "spec": spec.model_dump(mode="json")}
                for (ns, name), spec in sorted(sets.items())
            ],
        }
        fd, tmp = tempfile.mkstemp(prefix=".warm-sets-", dir=self.directory)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(document, f, indent=1)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        dir_fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    def load(self) -> dict[tuple[str, str], WarmSetSpec]:
        """The saved sets; {} (with an error logged) when the file is unusable."""
        if not self.path.exists():
            return {}
        try:
            document = json.loads(self.path.read_text())
            if document.get("version") != FORMAT_VERSION:
                raise ValueError(f"unknown format version {document.get('version')!r}")
            return {
                (item["namespace"], item["name"]): WarmSetSpec.model_validate(item["spec"])
                for item in document["sets"]
            }
        except (OSError, ValueError, KeyError, TypeError, AttributeError, ValidationError) as exc:
            log.error("ignoring unreadable warm-set state %s: %s", self.path, exc)
            return {}
