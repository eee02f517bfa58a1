"""Warm (pinned) blocks on disk under `--state-dir`: one safetensors file per block,
named by its key, written atomically (temp file, fsync, rename, fsync of the directory)
by a background thread, within a disk budget.

The warm manager says which blocks it wants kept (every prompt of a pinned set) and
which chains are warm now; the writer stores the warm blocks it has not stored yet and
deletes files nobody wants. A file that does not decode (another fingerprint, a
truncated write, a checksum mismatch) is ignored with one log line and deleted, and
that prompt is prefilled as without snapshots. Only regular files are read (opened
without blocking, checked with fstat): anything else under a block's name is a miss.
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from warmfleet_common.chunking import BlockKey, Chunk
from warmfleet_daemon.engine import kv
from warmfleet_daemon.kvtransfer.codec import BlockCodec, BlockError
from warmfleet_daemon.support.regular_files import (
    UnusableFile,
    check_regular,
    descriptor_path,
    open_regular,
)

log = logging.getLogger(__name__)

SUBDIR = "kv-blocks"
SUFFIX = ".safetensors"

Lookup = Callable[[BlockKey], tuple[kv.BlockPayload, int, int] | None]  # payload, start, end


@dataclass(frozen=True)
class SnapshotStats:
    files: int
    bytes: int
    budget_bytes: int
    written: int
    restored: int
    ignored: int  # unreadable, corrupt or another fingerprint
    skipped_over_budget: int


def check_directory(state_dir: str | Path) -> None:
    """Raise OSError, saying why, unless the snapshot directory under `state_dir` can be
    created and written: `warmfleet serve` stops at start rather than never get ready."""
    directory = Path(state_dir) / SUBDIR
    if directory.exists() and not directory.is_dir():
        raise NotADirectoryError(
            f"{directory} is not a directory: it is where --state-dir keeps KV snapshots "
            "(move it away, or pass --snapshot-disk-mb 0)"
        )
    directory.mkdir(parents=True, exist_ok=True)
    fd, probe = tempfile.mkstemp(prefix=".probe-", dir=directory)  # "." files: unfinished
    os.close(fd)
    os.unlink(probe)


class SnapshotStore:
    def __init__(self, state_dir: str | Path, codec: BlockCodec, budget_bytes: int) -> None:
        self.directory = Path(state_dir) / SUBDIR
        self.directory.mkdir(parents=True, exist_ok=True)
        self.codec = codec
        self.budget_bytes = budget_bytes
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._sizes: dict[BlockKey, int] = {}
        self._written = self._restored = self._ignored = self._skipped = 0
        for path in self.directory.iterdir():
            if path.name.startswith("."):  # a write that never finished
                path.unlink(missing_ok=True)
            elif path.suffix == SUFFIX:
                try:
                    key, info = bytes.fromhex(path.stem), path.stat()  # stat never blocks
                except (ValueError, OSError):
                    continue
                try:
                    check_regular(path, info.st_mode)
                except UnusableFile as exc:  # a FIFO would block the reader: never read it
                    log.warning(
                        "Ignoring KV snapshot %s (it will be prefilled): %s", path.name, exc
                    )
                    self._ignored += 1
                    continue
                self._sizes[key] = info.st_size
        self._pending: tuple[set[BlockKey], list[list[BlockKey]], Lookup] | None = None
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="warmfleet-snapshots", daemon=True)
        self._thread.start()

    # -- reading (warm-up, before prefill) -------------------------------------------

    def read(self, chunk: Chunk) -> kv.BlockPayload | None:
        """The stored block for `chunk`, verified; None if absent or unusable."""
        with self._lock:
            if chunk.key not in self._sizes:
                return None
        path = self._path(chunk.key)
        try:
            with open_regular(path, self.codec.max_block_bytes(chunk.size)) as fd:
                payload = self.codec.from_file(descriptor_path(fd, path), chunk)
        except OSError as exc:  # gone, not a regular file, too large
            log.warning("Ignoring KV snapshot %s (it will be prefilled): %s", path.name, exc)
            with self._lock:
                self._ignored += 1
                self._sizes.pop(chunk.key, None)
            return None
        except BlockError as exc:
            log.warning("Ignoring KV snapshot %s (it will be prefilled): %s", path.name, exc)
            with self._lock:
                self._ignored += 1
                self._sizes.pop(chunk.key, None)
            path.unlink(missing_ok=True)
            return None
        with self._lock:
            self._restored += 1
        return payload

    # -- writing (background) ----------------------------------------------------------

    def sync(self, wanted: set[BlockKey], warm: list[list[BlockKey]], lookup: Lookup) -> None:
        """Keep the blocks of `wanted` on disk, store those of the `warm` chains (keys
        root first) not stored yet, their payloads from `lookup`; delete the rest.
        Returns at once."""
        with self._lock:
            self._pending = (set(wanted), [list(c) for c in warm], lookup)
            self._wake.notify_all()

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until the last sync is on disk (tests, shutdown)."""
        with self._lock:
            return self._wake.wait_for(lambda: self._pending is None and not self._busy, timeout)

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
            self._wake.notify_all()
        self._thread.join(timeout=30)

    def stats(self) -> SnapshotStats:
        with self._lock:
            return SnapshotStats(
                files=len(self._sizes),
                bytes=sum(self._sizes.values()),
                budget_bytes=self.budget_bytes,
                written=self._written,
                restored=self._restored,
                ignored=self._ignored,
                skipped_over_budget=self._skipped,
            )

    _busy = False

    def _run(self) -> None:
        while True:
            with self._lock:
                self._wake.wait_for(lambda: self._pending is not None or self._stopping)
                if self._pending is None:  # stopping with nothing to write
                    return
                job, self._pending = self._pending, None
                self._busy = True
            try:
                self._apply(*job)
            except Exception:  # a full disk must not take the daemon down
                log.exception("writing KV snapshots failed")
            with self._lock:
                self._busy = False
                self._wake.notify_all()

    def _apply(
        self, wanted: set[BlockKey], warm: Sequence[Sequence[BlockKey]], lookup: Lookup
    ) -> None:
        with self._lock:
            unwanted = [k for k in self._sizes if k not in wanted]
        for key in unwanted:
            self._path(key).unlink(missing_ok=True)
            with self._lock:
                self._sizes.pop(key, None)
        wrote = False
        for chain in warm:
            for key in chain:
                with self._lock:
                    if key in self._sizes:
                        continue
                found = lookup(key)
                if found is None:  # evicted or cleared meanwhile: the rest cannot reload
                    break
                payload, start, end = found
                chunk = Chunk(start, end, key)
                data = self.codec.to_bytes(payload, chunk)
                with self._lock:
                    over = sum(self._sizes.values()) + len(data) > self.budget_bytes
                    if over:
                        self._skipped += 1
                if over:
                    log.warning(
                        "KV snapshot budget (%.0f MiB, --snapshot-disk-mb) is full: %s not "
                        "stored; it will be prefilled after a restart",
                        self.budget_bytes / (1 << 20),
                        chunk.key.hex(),
                    )
                    return self._sync_dir(wrote)
                self._write(chunk.key, data)
                wrote = True
        self._sync_dir(wrote)

    def _write(self, key: BlockKey, data: bytes) -> None:
        path = self._path(key)
        tmp = path.with_name(f".{path.name}.tmp")
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        with self._lock:
            self._sizes[key] = len(data)
            self._written += 1

    def _sync_dir(self, wrote: bool) -> None:
        if not wrote:
            return
        fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _path(self, key: BlockKey) -> Path:
        return self.directory / f"{key.hex()}{SUFFIX}"
