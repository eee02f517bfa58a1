"""The disk tier: every prefix-cache block also lives on disk, so a block evicted from
RAM is read back instead of prefilled, and a restarted daemon resumes every session.

Writing is write-behind, on a thread of its own: each block the cache stores is queued
(bounded in bytes; the queue holds the payload, so a block evicted before it is written
is still written) and saved in the snapshot format (`codec`: safetensors, checksummed,
with the KV fingerprint and the block's key, span and parent in its header), atomically
(a "." temp file, fsync, rename), one directory per fingerprint. The disk budget is kept
by `DiskIndex` (least recently used leaves go first). A block that cannot be queued when
RAM evicts it is counted as dropped.

Reading continues a RAM match: the engine asks for the run of a prompt's next chunks
the index holds, and a reader thread reads them in order (checked like any snapshot:
a corrupt, truncated or mismatched file is a miss with one log line, and deleted),
inserting each into the RAM cache and waking the engine, which restores or computes the
earlier chunks meanwhile and waits only for a block still being read.

The index is rebuilt at start from file names and headers (no KV read). A full or
failing disk (any OSError on write) turns the tier off: /v1/status and a metric say so
and why, the daemon goes on serving from RAM.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import struct
import tempfile
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from warmfleet_common.chunking import BlockKey, Chunk
from warmfleet_common.tiers import Tier
from warmfleet_daemon.cache.events import TierListener
from warmfleet_daemon.cache.prefix_cache import BlockSource, BlockView, PrefixCache
from warmfleet_daemon.engine import kv
from warmfleet_daemon.engine.requests import GenerationRequest
from warmfleet_daemon.engine.threads import wait_until_gone
from warmfleet_daemon.engine.tiers import Prefetch
from warmfleet_daemon.kvtransfer.codec import FORMAT, BlockCodec, BlockError
from warmfleet_daemon.kvtransfer.context import TierContext
from warmfleet_daemon.kvtransfer.costs import fastest_time
from warmfleet_daemon.kvtransfer.disk_index import DiskEntry, DiskIndex
from warmfleet_daemon.support.regular_files import (
    UnusableFile,
    check_regular,
    descriptor_path,
    open_regular,
)

log = logging.getLogger(__name__)

SUFFIX = ".safetensors"
_MAX_HEADER = 1 << 20  # a block's safetensors header: metadata and tensor offsets
DEFAULT_QUEUE_BYTES = 256 << 20


@dataclass(frozen=True)
class DiskTierStats:
    state: Literal["on", "off"]
    error: str | None  # why it turned itself off
    directory: str
    blocks: int
    bytes: int
    budget_bytes: int
    queued_blocks: int  # write-behind queue
    queued_bytes: int
    written_blocks: int
    written_bytes: int
    write_seconds: float
    read_blocks: int
    read_bytes: int
    read_seconds: float
    evictions: int  # deleted for the disk budget
    dropped_blocks: int  # evicted from RAM and never written (queue full, tier off)
    ignored_files: int  # corrupt, truncated, mismatched or not regular


class DiskTier:
    def __init__(
        self,
        directory: str | Path,
        codec: BlockCodec,
        budget_bytes: int,
        cache: PrefixCache[kv.BlockPayload],
        *,
        queue_bytes: int = DEFAULT_QUEUE_BYTES,
    ) -> None:
        self.directory = Path(directory) / codec.fingerprint
        self.codec = codec
        self.cache = cache
        self.queue_bytes = queue_bytes
        self._lock = threading.Condition()
        self._index = DiskIndex(budget_bytes)
        self._queue: OrderedDict[BlockKey, tuple[Chunk, BlockKey | None, kv.BlockPayload]] = (
            OrderedDict()
        )
        self._queued_bytes = 0
        self._reads: deque[tuple[Prefetch, Callable[[], None]]] = deque()
        self._error: str | None = None
        self._stopping = False
        self._writing = False
        self._written = self._written_bytes = 0
        self._read = self._read_bytes = 0
        self._write_s = self._read_s = 0.0
        self._dropped = self._ignored = 0
        # Told of every block the disk gains or loses, under the tier's lock (the cache
        # event log: tier "disk"). Must not block.
        self.listeners: list[TierListener] = []
        self._to_delete: list[DiskEntry] = []  # files of a cleared cache, to delete
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd, probe = tempfile.mkstemp(prefix=".probe-", dir=self.directory)
            os.close(fd)
            os.unlink(probe)
            self._rebuild()
        except OSError as exc:
            self._turn_off(f"cannot use {self.directory}: {exc}")
        cache.spill = self._evicted
        cache.listeners.append(self._changed)
        self._writer = threading.Thread(target=self._write_loop, name="warmfleet-disk-write")
        self._reader = threading.Thread(target=self._read_loop, name="warmfleet-disk-read")
        self._writer.daemon = self._reader.daemon = True
        self._writer.start()
        self._reader.start()

    # -- what the engine asks ---------------------------------------------------------

    name: Tier = "disk"

    def prefetch(
        self,
        request: GenerationRequest,
        chunks: Sequence[Chunk],
        start: int,
        wake: Callable[[], None],
    ) -> Prefetch | None:
        """Start reading `chunks[start:]` that the disk holds, in order (no I/O here).
        None when the disk has not the next one."""
        with self._lock:
            if self._error is not None:
                return None
            count = 0
            for chunk in chunks[start:]:
                entry = self._index.get(chunk.key)
                on_disk = entry is not None and (entry.start, entry.end) == (chunk.start, chunk.end)
                if not on_disk and chunk.key not in self._queue:  # (queued: evicted, unwritten)
                    break
                count += 1
            if count == 0:
                return None
            job = Prefetch(
                list(chunks[start : start + count]), chunks[start - 1].key if start else None
            )
            self._reads.append((job, wake))
            self._lock.notify_all()
            return job

    def store(
        self,
        chunk: Chunk,
        parent: BlockKey | None,
        payload: kv.BlockPayload,
        source: BlockSource = "prefill",
    ) -> bool:
        """Queue a block that RAM did not take because its parent had left RAM (for the
        disk, a chain may continue after its parent), if the disk holds the parent."""
        with self._lock:
            if parent is not None and parent not in self._index and parent not in self._queue:
                return False
        view = BlockView(chunk.key, parent, chunk.start, chunk.end, payload, False)
        return self._offer(view)

    def read_seconds(self, payload: kv.BlockPayload, chunk: Chunk, budget_s: float) -> float | None:
        """A block written as this tier writes one (a "." file: a restart deletes it if we
        die meanwhile) and read back as it reads one, from the device where the OS lets us
        say so; None if the tier is off or the directory refuses it."""
        if self.stats().state != "on":
            return None
        path = self.directory / f".cost-probe-{os.getpid()}{SUFFIX}"
        try:
            self.codec.save(payload, chunk, str(path))
            _drop_from_page_cache(path)

            def read() -> None:
                with open_regular(path, self.codec.max_block_bytes(chunk.size)) as fd:
                    self.codec.from_file(descriptor_path(fd, path), chunk)  # evaluated, checked
                _drop_from_page_cache(path)

            return fastest_time(read, budget_s)
        except Exception as exc:
            log.warning(
                "Could not measure the disk tier's read cost in %s: %s", self.directory, exc
            )
            return None
        finally:
            path.unlink(missing_ok=True)

    def holds(self, key: BlockKey) -> bool:
        with self._lock:
            return key in self._index or key in self._queue

    # -- lifecycle --------------------------------------------------------------------

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until every queued block is on disk (tests, shutdown)."""
        with self._lock:
            return self._lock.wait_for(lambda: not self._queue and not self._writing, timeout)

    def save_all(self, timeout: float = 30.0) -> bool:
        """Queue every RAM block not on disk yet and wait for them (a graceful stop: the
        next start resumes every session)."""
        blocks, _ = self.cache.snapshot(lambda: None)
        for block in blocks:
            self._offer(block)
        return self.flush(timeout)

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
            for job, _ in self._reads:
                job.cancelled = True
            self._reads.clear()
            self._lock.notify_all()
        for thread in (self._writer, self._reader):
            thread.join(timeout=30)
            wait_until_gone(thread)  # they ran mlx: see wait_until_gone

    def stats(self) -> DiskTierStats:
        with self._lock:
            index = self._index.stats
            return DiskTierStats(
                state="off" if self._error else "on",
                error=self._error,
                directory=str(self.directory),
                blocks=index.blocks,
                bytes=index.bytes,
                budget_bytes=index.budget_bytes,
                queued_blocks=len(self._queue),
                queued_bytes=self._queued_bytes,
                written_blocks=self._written,
                written_bytes=self._written_bytes,
                write_seconds=self._write_s,
                read_blocks=self._read,
                read_bytes=self._read_bytes,
                read_seconds=self._read_s,
                evictions=index.evictions,
                dropped_blocks=self._dropped,
                ignored_files=self._ignored,
            )

    # -- the cache's hooks (under its lock: no I/O) -----------------------------------

    def _changed(self, kind: str, block: BlockView[kv.BlockPayload] | None) -> None:
        if kind == "stored" and block is not None:
            self._offer(block)
        elif kind == "cleared":  # the disk goes too (its files on the writer thread)
            with self._lock:
                self._queue.clear()
                self._queued_bytes = 0
                self._epoch += 1
                self._to_delete.extend(self._index.clear())
                self._lock.notify_all()

    def _evicted(self, block: BlockView[kv.BlockPayload]) -> None:
        if not self._offer(block):
            with self._lock:
                self._dropped += 1

    def _offer(self, block: BlockView[kv.BlockPayload]) -> bool:
        """Queue a block for writing; False if it is not and will not be on disk."""
        with self._lock:
            if block.key in self._index or block.key in self._queue:
                return True
            nbytes = block.payload.nbytes
            if self._error is not None or not self._index.would_fit(nbytes):
                return False
            if self._queued_bytes + nbytes > self.queue_bytes:
                return False
            chunk = Chunk(block.start, block.end, block.key)
            self._queue[block.key] = (chunk, block.parent, block.payload)
            self._queued_bytes += nbytes
            self._lock.notify_all()
            return True

    _epoch = 0  # cache clears so far: a write that straddles one is discarded

    # -- writing ------------------------------------------------------------------------

    def _write_loop(self) -> None:
        while True:
            with self._lock:
                self._lock.wait_for(lambda: self._queue or self._to_delete or self._stopping)
                if self._to_delete:
                    gone, self._to_delete = self._to_delete, []
                    job: tuple[Chunk, BlockKey | None, kv.BlockPayload] | None = None
                elif self._queue:
                    gone = []
                    job = next(iter(self._queue.values()))
                    epoch = self._epoch
                    self._writing = True
                else:  # stopping with nothing left
                    return
            for entry in gone:
                self._path(entry.key).unlink(missing_ok=True)
            if job is not None:
                self._write_one(*job, epoch)
            with self._lock:
                self._writing = False
                self._lock.notify_all()

    def _write_one(
        self, chunk: Chunk, parent: BlockKey | None, payload: kv.BlockPayload, epoch: int
    ) -> None:
        path = self._path(chunk.key)
        tmp = path.with_name(f".{chunk.key.hex()}.tmp{SUFFIX}")
        started = time.perf_counter()
        try:
            if self._error is None:
                self.codec.save(payload, chunk, str(tmp), parent)
                fd = os.open(tmp, os.O_RDONLY)
                try:
                    os.fsync(fd)
                    size = os.fstat(fd).st_size
                finally:
                    os.close(fd)
                os.replace(tmp, path)
        except Exception as exc:  # a full disk, a read-only directory, an I/O error
            tmp.unlink(missing_ok=True)
            self._turn_off(f"writing {path.name} failed: {exc}{_free_space(self.directory)}")
            return
        finally:
            with self._lock:
                if self._queue.pop(chunk.key, None) is not None:
                    self._queued_bytes -= payload.nbytes
        if self._error is not None:
            return
        with self._lock:
            evicted: list[DiskEntry] = []
            if epoch != self._epoch:  # the cache was cleared while it was written
                fits = False
            else:
                logits = payload.logits is not None
                entry = DiskEntry(chunk.key, parent, chunk.start, chunk.end, size, logits)
                fits, evicted = self._index.add(entry)
                for gone in evicted:
                    self._notify("evicted", gone)
                if fits:
                    self._notify("stored", entry)
            self._written += 1
            self._written_bytes += size
            self._write_s += time.perf_counter() - started
        for entry in evicted:
            self._path(entry.key).unlink(missing_ok=True)
        if not fits:
            path.unlink(missing_ok=True)

    def _notify(self, kind: Literal["stored", "evicted"], entry: DiskEntry) -> None:
        for listener in self.listeners:
            try:
                listener(kind, entry)
            except Exception:  # the event log must never stop the disk tier
                log.exception("a disk-tier listener failed")

    def held(self) -> list[DiskEntry]:
        """Every block on disk (for the cache snapshot)."""
        with self._lock:
            return self._index.entries()

    def _turn_off(self, why: str) -> None:
        with self._lock:
            if self._error is not None:
                return
            self._error = why
            self._dropped += len(self._queue)
            self._queue.clear()
            self._queued_bytes = 0
            for entry in self._index.clear():  # nothing is read from a disk that is off
                self._notify("evicted", entry)
            for job, _ in self._reads:
                job.failed = True
            self._lock.notify_all()
        log.error("The disk tier is off (serving from RAM only): %s", why)

    # -- reading ------------------------------------------------------------------------

    def _read_loop(self) -> None:
        while True:
            with self._lock:
                self._lock.wait_for(lambda: self._reads or self._stopping)
                if self._stopping:
                    return
                job, wake = self._reads.popleft()
            try:
                self._read_job(job, wake)
            except Exception:  # never leave a prompt waiting on a read that died
                log.exception("reading from the disk tier failed")
                job.failed = True
            wake()

    def _read_job(self, job: Prefetch, wake: Callable[[], None]) -> None:
        parent = job.parent
        for chunk in job.chunks:
            if job.cancelled or self._error is not None:
                job.failed = True
                return
            if chunk.key not in self.cache:
                payload = self._load(chunk)
                if payload is None:
                    job.failed = True
                    return
                self.cache.insert(chunk, parent, payload, payload.nbytes, source="disk")
                # The prompt's own until it takes it: RAM may evict it before then (a
                # session larger than RAM's room, or other prompts' blocks).
                job.held[chunk.key] = payload
                job.read.add(chunk.key)
            parent = chunk.key
            job.done += 1
            wake()

    def _load(self, chunk: Chunk) -> kv.BlockPayload | None:
        with self._lock:
            queued = self._queue.get(chunk.key)
            on_disk = chunk.key in self._index
            if on_disk:
                self._index.touch([chunk.key])
        if queued is not None:
            return queued[2]
        if not on_disk:
            return None
        path = self._path(chunk.key)
        started = time.perf_counter()
        try:
            with open_regular(path, self.codec.max_block_bytes(chunk.size)) as fd:
                size = os.fstat(fd).st_size
                payload = self.codec.from_file(descriptor_path(fd, path), chunk)
        except (OSError, BlockError) as exc:
            log.warning("Ignoring disk-tier block %s (it will be prefilled): %s", path.name, exc)
            with self._lock:
                self._ignored += 1
                gone = self._index.remove(chunk.key)
                if gone is not None:
                    self._notify("evicted", gone)
            if isinstance(exc, BlockError):
                path.unlink(missing_ok=True)
            return None
        with self._lock:
            self._read += 1
            self._read_bytes += size
            self._read_s += time.perf_counter() - started
        return payload

    # -- the index at start -------------------------------------------------------------

    def _rebuild(self) -> None:
        """The index from file names and headers, least recently used first (mtime)."""
        found: list[tuple[float, DiskEntry]] = []
        for path in self.directory.iterdir():
            if path.name.startswith("."):  # a write that never finished
                path.unlink(missing_ok=True)
                continue
            if path.suffix != SUFFIX:
                continue
            try:
                entry, mtime = self._entry_of(path)
            except (OSError, BlockError, ValueError) as exc:
                log.warning("Ignoring disk-tier block %s: %s", path.name, exc)
                self._ignored += 1
                if not isinstance(exc, UnusableFile):
                    path.unlink(missing_ok=True)
                continue
            found.append((mtime, entry))
        for _, entry in sorted(found, key=lambda f: f[0]):
            fits, evicted = self._index.add(entry)
            for gone in evicted:
                self._path(gone.key).unlink(missing_ok=True)
            if not fits:
                self._path(entry.key).unlink(missing_ok=True)
        if found:
            stats = self._index.stats
            log.info(
                "Disk tier: %d block(s), %.1f MiB in %s",
                stats.blocks,
                stats.bytes / (1 << 20),
                self.directory,
            )

    def _entry_of(self, path: Path) -> tuple[DiskEntry, float]:
        key = bytes.fromhex(path.stem)
        info = path.stat()  # stat never blocks
        check_regular(path, info.st_mode)
        meta, names = read_header(path, _MAX_HEADER)
        if meta.get("format") != FORMAT:
            raise BlockError(f"unknown block format {meta.get('format')!r}")
        if meta.get("fingerprint") != self.codec.fingerprint:
            raise BlockError("another fingerprint")
        if meta.get("key") != path.stem:
            raise BlockError(f"its header names block {meta.get('key')}")
        parent = meta.get("parent")
        start, end = int(meta["start"]), int(meta["end"])
        if not 0 <= start < end:
            raise BlockError(f"span [{start}:{end})")
        return (
            DiskEntry(
                key,
                bytes.fromhex(parent) if parent else None,
                start,
                end,
                info.st_size,
                "logits" in names,
            ),
            info.st_mtime,
        )

    def _path(self, key: BlockKey) -> Path:
        return self.directory / f"{key.hex()}{SUFFIX}"


def _free_space(directory: Path) -> str:
    """How full the disk is (mlx's write errors do not say why)."""
    try:
        return f" ({shutil.disk_usage(directory).free} bytes free on its file system)"
    except OSError:
        return ""


def read_header(path: str | Path, max_bytes: int) -> tuple[dict[str, Any], set[str]]:
    """A safetensors file's `__metadata__` and tensor names, from its header alone
    (bounded)."""
    with open_regular(path, 1 << 62) as fd:
        head = os.read(fd, 8)
        if len(head) < 8:
            raise BlockError("truncated (no header)")
        (length,) = struct.unpack("<Q", head)
        if length > max_bytes:
            raise BlockError(f"a {length}-byte header")
        raw = b""
        while len(raw) < length and (part := os.read(fd, length - len(raw))):
            raw += part
        if len(raw) < length:
            raise BlockError("truncated header")
        size = os.fstat(fd).st_size
    try:
        header = json.loads(raw)
    except ValueError as exc:
        raise BlockError(f"unreadable header ({exc})") from exc
    meta = header.get("__metadata__") if isinstance(header, dict) else None
    if not isinstance(meta, dict):
        raise BlockError("no metadata in its header")
    ends = [
        v["data_offsets"][1]
        for k, v in header.items()
        if k != "__metadata__" and isinstance(v, dict) and "data_offsets" in v
    ]
    if 8 + length + max(ends, default=0) > size:
        raise BlockError("truncated (shorter than its header says)")
    return meta, {k for k in header if k != "__metadata__"}


def build(context: TierContext) -> DiskTier | None:
    """The disk tier, when `--cache-dir` and a disk budget are set."""
    options = context.options
    if options.cache_dir is None or options.cache_disk_budget_bytes <= 0:
        return None
    return DiskTier(
        options.cache_dir, context.codec, options.cache_disk_budget_bytes, context.cache
    )


def _drop_from_page_cache(path: Path) -> None:
    # A block read back was usually written long before: read it from the device where
    # the OS lets us say so (Linux); macOS has no posix_fadvise.
    advise = getattr(os, "posix_fadvise", None)
    if advise is None:
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        advise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
