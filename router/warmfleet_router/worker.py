"""A key worker: `python -m warmfleet_router.worker LAYOUT_DIR`. Reads framed jobs on
stdin (8-byte big-endian length, a pickle of (kind, payload), then 8-byte length and
the request body for a job that has one) and answers each, in order, on stdout (length,
pickle). Kinds: "prepare" (a `prepare.Job`) and "load" (build a
layout's keyer now). The router writes the pickles itself; nothing else reaches this
pipe."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import pickle
import sys
from pathlib import Path
from typing import Any, BinaryIO

from warmfleet_router.prepare import Job, KeyerCache, prepare

HEADER = 8


def serve(directory: Path, source: BinaryIO, sink: BinaryIO) -> None:
    cache = KeyerCache(directory)
    while True:
        header = source.read(HEADER)
        if len(header) < HEADER:
            return  # the router closed the pipe: it is stopping
        kind, payload = pickle.loads(source.read(int.from_bytes(header, "big")))
        raw = source.read(int.from_bytes(source.read(HEADER), "big"))
        if raw and isinstance(payload, Job):
            payload = dataclasses.replace(payload, raw=raw)
        answer: Any = None  # the router prepares such a request itself
        try:
            if kind == "prepare":
                answer = prepare(payload, cache)
            elif kind == "load":
                answer = cache.get(payload) is not None
        except Exception:
            logging.getLogger(__name__).exception("key worker: %s failed", kind)
        data = pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL)
        sink.write(len(data).to_bytes(HEADER, "big") + data)
        sink.flush()


def main() -> None:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    sink = sys.stdout.buffer
    sys.stdout = sys.stderr  # a stray print must not corrupt the frames
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C reaches the whole group
        serve(Path(sys.argv[1]), sys.stdin.buffer, sink)


if __name__ == "__main__":
    main()
