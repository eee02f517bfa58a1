"""The simulated engine's blocks on disk and on the wire, so that its disk tier, warm
snapshots and peer copies are the real ones (`kvtransfer`), with only the bytes left out.

A simulated block is its size (`kv.BlockPayload.nbytes`, the profiled machine's) and, for
a prompt's last block, where its answer starts (`SimLogits`). It is written as a
safetensors file whose header holds that, with the fingerprint, key, span, parent and a
checksum, like a real block's; on disk its tensor is a hole of the block's size (a sparse
file: the disk tier's budget counts the profiled bytes, the disk holds a header), on the
wire only the header goes.

Reading one takes the profile's time: a disk read sleeps what the profile's disk tier
costs beyond a RAM hit, a peer copy what its peer tier costs beyond one (divided by the
speed), on the tier's own thread as the real reads; the engine then charges the RAM
restore it does for every cached block (`SimPrefiller`).
"""

from __future__ import annotations

import hashlib
import json
import struct
import time
from typing import Any, cast

from warmfleet_common.chunking import BlockKey, Chunk
from warmfleet_common.perf_profile import PerfProfile, dump_profile
from warmfleet_common.tiers import Tier
from warmfleet_daemon.engine import kv
from warmfleet_daemon.kvtransfer.codec import FORMAT, BlockCodec, BlockError
from warmfleet_daemon.sim.clock import SimClock
from warmfleet_daemon.sim.forward import SimLogits

_MAX_HEADER = 1 << 16  # a simulated block's header: metadata only


class SimCodec(BlockCodec):
    def __init__(self, profile: PerfProfile, block_size: int, clock: SimClock) -> None:
        super().__init__(sim_fingerprint(profile, block_size), ())
        self.profile = profile
        self.clock = clock

    def kv_bytes_per_token(self) -> int:
        return self.profile.kv_bytes_per_token

    def max_block_bytes(self, tokens: int) -> int:
        return self.kv_bytes_per_token() * tokens + self.profile.logits_bytes + _MAX_HEADER

    # -- writing ------------------------------------------------------------------------

    def save(
        self, payload: kv.BlockPayload, chunk: Chunk, path: str, parent: BlockKey | None = None
    ) -> None:
        """The header, then a hole of the block's size."""
        header = self._header(payload, chunk, parent, data_bytes=payload.nbytes)
        with open(path, "wb") as f:
            f.write(header)
            f.truncate(len(header) + payload.nbytes)

    def to_bytes(self, payload: kv.BlockPayload, chunk: Chunk) -> bytes:
        return self._header(payload, chunk, None, data_bytes=0)

    # -- reading ------------------------------------------------------------------------

    def from_file(self, path: str, chunk: Chunk) -> kv.BlockPayload:
        with open(path, "rb") as f:
            raw = f.read(8 + _MAX_HEADER)
        payload = self._decode(raw, chunk)
        self._read_time("disk", chunk.size)
        return payload

    def from_bytes(self, data: bytes, chunk: Chunk) -> kv.BlockPayload:
        payload = self._decode(data, chunk)
        self._read_time("peer", chunk.size)
        return payload

    # -- helpers --------------------------------------------------------------------------

    def _header(
        self, payload: kv.BlockPayload, chunk: Chunk, parent: BlockKey | None, data_bytes: int
    ) -> bytes:
        logits = payload.logits
        meta = {
            "format": FORMAT,
            "fingerprint": self.fingerprint,
            "key": chunk.key.hex(),
            "start": str(chunk.start),
            "end": str(chunk.end),
            "layers": "0",
            "sim.nbytes": str(payload.nbytes),
        }
        if parent is not None:
            meta["parent"] = parent.hex()
        if logits is not None:
            meta["sim.answer_offset"] = str(cast(SimLogits, logits).offset)
        meta["checksum"] = _checksum(meta)
        header: dict[str, Any] = {
            "__metadata__": meta,
            "kv": {"dtype": "U8", "shape": [data_bytes], "data_offsets": [0, data_bytes]},
        }
        if logits is not None:  # the disk tier's index reads a last block's logits by name
            header["logits"] = {"dtype": "U8", "shape": [0], "data_offsets": [0, 0]}
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)  # safetensors aligns the data to 8 bytes
        return struct.pack("<Q", len(raw)) + raw

    def _decode(self, raw: bytes, chunk: Chunk) -> kv.BlockPayload:
        if len(raw) < 8:
            raise BlockError("truncated (no header)")
        (length,) = struct.unpack("<Q", raw[:8])
        if length > _MAX_HEADER or len(raw) < 8 + length:
            raise BlockError(f"a {length}-byte header, {len(raw) - 8} bytes read")
        try:
            header = json.loads(raw[8 : 8 + length])
            meta = header["__metadata__"]
            nbytes = int(meta["sim.nbytes"])
        except (ValueError, KeyError, TypeError) as exc:
            raise BlockError(f"unreadable simulated block header ({exc})") from exc
        if meta.get("format") != FORMAT:
            raise BlockError(f"unknown block format {meta.get('format')!r}")
        if meta.get("fingerprint") != self.fingerprint:
            raise BlockError(f"fingerprint {meta.get('fingerprint')} is not {self.fingerprint}")
        if meta.get("checksum") != _checksum({k: v for k, v in meta.items() if k != "checksum"}):
            raise BlockError("checksum mismatch (corrupt block)")
        span = (meta.get("key"), meta.get("start"), meta.get("end"))
        if span != (chunk.key.hex(), str(chunk.start), str(chunk.end)):
            raise BlockError(
                f"block is {span}, expected {chunk.key.hex()} [{chunk.start}:{chunk.end})"
            )
        offset = meta.get("sim.answer_offset")
        logits: Any = SimLogits(int(offset)) if offset is not None else None
        return kv.BlockPayload((), nbytes, logits)

    def _read_time(self, tier: Tier, tokens: int) -> None:
        profile = self.profile
        beyond_ram = profile.restore_seconds(tier, tokens) - profile.restore_seconds("ram", tokens)
        if beyond_ram > 0:
            time.sleep(beyond_ram / self.clock.speed)


def sim_fingerprint(profile: PerfProfile, block_size: int) -> str:
    """Blocks move only between simulated daemons of the same profile and block size."""
    h = hashlib.blake2b(digest_size=16)
    h.update(b"sim:")
    h.update(dump_profile(profile).encode())
    h.update(f"block_size:{block_size}".encode())
    return h.hexdigest()


def _checksum(meta: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(meta, sort_keys=True).encode()).hexdigest()
