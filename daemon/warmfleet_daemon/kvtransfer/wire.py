"""The stream of `GET /v1/cache/blocks`: one frame per block, an 8-byte big-endian
length then the block's safetensors bytes. Read incrementally so a transfer holds at
most one block in memory."""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator

MEDIA_TYPE = "application/x-warmfleet-kv-blocks"
_HEADER = struct.Struct(">Q")
FRAME_HEADER_BYTES = _HEADER.size


class FrameError(ValueError):
    pass


def frame(data: bytes) -> bytes:
    return _HEADER.pack(len(data)) + data


def read_frames(chunks: Iterable[bytes], max_frame: int) -> Iterator[bytes]:
    """The frames of a byte stream; FrameError if one is too large or cut short."""
    buffer = bytearray()
    need: int | None = None
    for piece in chunks:
        buffer += piece
        while True:
            if need is None:
                if len(buffer) < _HEADER.size:
                    break
                (need,) = _HEADER.unpack_from(buffer)
                del buffer[: _HEADER.size]
                if need > max_frame:
                    raise FrameError(f"a block of {need} bytes exceeds the {max_frame} limit")
            if len(buffer) < need:
                break
            yield bytes(buffer[:need])
            del buffer[:need]
            need = None
    if buffer or need is not None:
        raise FrameError("the stream ended in the middle of a block")
