"""A file whose content a running component uses and reads again when it changes: the
client keys, the quotas. A Secret or ConfigMap volume swaps a symlink, an editor writes
in place: either changes the file's inode, size or mtime, looked at most once every
`check_s`. A file that no longer parses (or is gone) keeps what was read before, and
says why once per kind of trouble; the first read raises, so a command stops at start
with the reason. No message quotes the file's content (a keys file's lines are secrets).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")
CHECK_S = 1.0


class WatchedFile(Generic[T]):
    def __init__(
        self,
        path: str,
        parse: Callable[[str], T],
        what: str,
        *,
        check_s: float = CHECK_S,
        describe: Callable[[T], str] = lambda _: "",
    ) -> None:
        self.path = path
        self.what = what
        self.check_s = check_s
        self._parse = parse
        self._describe = describe
        self._lock = threading.Lock()
        self._stamp = self._stat()
        self._checked = time.monotonic()
        self._failed: str | None = None
        self.reloads = 0
        self.value: T = self._read()  # ValueError / OSError at start: the caller stops

    def current(self) -> T:
        """The content, after a look at the file at most once every `check_s`."""
        now = time.monotonic()
        if now - self._checked < self.check_s:
            return self.value
        with self._lock:
            if now - self._checked < self.check_s:
                return self.value
            self._checked = now
            try:
                stamp = self._stat()
            except OSError as exc:
                self._fail(f"cannot be read ({type(exc).__name__}); what was read before stays")
                return self.value
            if stamp == self._stamp:
                return self.value
            try:
                value = self._read()
            except (ValueError, OSError) as exc:
                self._fail(f"{exc}; what was read before stays")
                return self.value
            self._stamp, self.value, self._failed = stamp, value, None
            self.reloads += 1
            log.info("%s read again from %s%s", self.what, self.path, self._describe(value))
            return value

    def _fail(self, why: str) -> None:
        if why != self._failed:  # once per kind of trouble
            log.error("%s file %s: %s", self.what, self.path, why)
            self._failed = why

    def _stat(self) -> tuple[int, int, int]:
        st = os.stat(self.path)
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    def _read(self) -> T:
        with open(self.path, encoding="utf-8") as f:
            return self._parse(f.read())
