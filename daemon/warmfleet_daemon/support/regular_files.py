"""Reading what may be in the state directory: regular files only, bounded in size.

A FIFO (or a device) where a file is expected would block `open` until a writer comes,
or never end; mlx's loader waits holding the GIL, which stops every thread. So files
are opened without blocking (O_NONBLOCK) and checked with `fstat` before anything reads
them.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0)


class UnusableFile(OSError):
    """Not a regular file, or larger than the caller reads; the message says which."""


def check_regular(path: str | Path, mode: int) -> None:
    """UnusableFile, naming what it is, unless `mode` (from a stat) is a regular file's."""
    if stat.S_ISREG(mode):
        return
    kinds = (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    )
    kind = next((name for test, name in kinds if test(mode)), "something else")
    raise UnusableFile(f"{path} is {kind}, not a regular file")


@contextmanager
def open_regular(path: str | Path, max_bytes: int) -> Iterator[int]:
    """A read-only descriptor of `path`, once `fstat` says it is a regular file of at
    most `max_bytes`; UnusableFile (or another OSError) otherwise."""
    fd = os.open(path, _FLAGS)
    try:
        info = os.fstat(fd)
        check_regular(path, info.st_mode)
        if info.st_size > max_bytes:
            raise UnusableFile(f"{path} has {info.st_size} bytes, more than the {max_bytes} read")
        yield fd
    finally:
        os.close(fd)


def descriptor_path(fd: int, path: str | Path) -> str:
    """A path that opens the file behind `fd` (for readers that take a path, like
    mlx's): what they read is the file that was checked, even if its name moved on.
    Linux and macOS have /dev/fd; without it (no /proc), `path` itself."""
    by_descriptor = f"/dev/fd/{fd}"
    return by_descriptor if os.path.exists(by_descriptor) else str(path)


def read_regular(path: str | Path, max_bytes: int) -> bytes:
    """The bytes of a regular file of at most `max_bytes` (see open_regular)."""
    with open_regular(path, max_bytes) as fd:
        parts: list[bytes] = []
        size = 0
        while part := os.read(fd, min(1 << 20, max_bytes + 1 - size)):
            parts.append(part)
            size += len(part)
            if size > max_bytes:  # it grew after fstat
                raise UnusableFile(f"{path} has more than the {max_bytes} bytes read")
        return b"".join(parts)
