"""Copy warm blocks from a peer daemon with the same fingerprint (HTTP client side).

The peer's block keys hang off its own root (the model's path differs between
machines), so the client asks for its root, plans the prompt's chunks under it (the
same spans: the plan depends only on tokens, cuts and block size, which the
fingerprint covers) and requests them in small batches. Each block is verified before
it is handed on; any failure ends the copy there and the rest is prefilled.

With a peer grant (`warmfleet_common.grants`: issued by whoever named the peer, with
the peer's admin token) the client presents the grant instead of its own token: nodes
with different admin tokens copy from each other, and no node's token reaches another.
A peer that refuses it (401: expired, forged, for another URL) gives nothing: one log
line, and the blocks are prefilled.

A peer is another process: every response is read incrementally within a byte cap,
and the whole copy within the caller's deadline (one per warm-up); past either, the
copy is abandoned with one log line.
"""

from __future__ import annotations

import json
import logging
import ssl
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx

from warmfleet_common.chunking import Chunk, plan_chunks
from warmfleet_common.grants import GRANT_HEADER
from warmfleet_common.prompts import RenderedPrompt
from warmfleet_daemon.engine import kv
from warmfleet_daemon.kvtransfer.codec import BlockCodec, BlockError
from warmfleet_daemon.kvtransfer.wire import FRAME_HEADER_BYTES, FrameError, read_frames

log = logging.getLogger(__name__)

BATCH = 16  # blocks per request: bounds the URL length and what one response streams
MAX_KEYS = 256  # per request, on the serving side
FINGERPRINT_MAX_BYTES = 64 << 10  # a handful of fields
ERROR_BODY_MAX_BYTES = 1 << 10  # the part of an error body quoted in the log


class PeerLimit(Exception):
    """A response over its byte cap, or the copy past its deadline."""


class DeadlinePassed(PeerLimit):
    pass


class PeerClient:
    def __init__(
        self,
        codec: BlockCodec,
        *,
        token: str | None,
        timeout_s: float = 30.0,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.codec = codec
        self.verify: ssl.SSLContext | bool = tls if tls is not None else True
        self.headers = {"Accept-Encoding": "identity"}  # caps count what is held, not zipped
        if token:
            self.headers["Authorization"] = f"Bearer {token}"
        self.timeout_s = timeout_s

    def fetch(
        self,
        url: str,
        prompt: RenderedPrompt,
        chunks: list[Chunk],
        start: int,
        deadline: float,
        *,
        deadline_name: str = "the warm-up's deadline (--warm-from-deadline)",
        ended: list[str] | None = None,
        grant: str | None = None,
    ) -> Iterator[tuple[int, kv.BlockPayload]]:
        """Verified payloads of `chunks[start:]`, in order, as far as the peer has them,
        until `deadline` (time.monotonic(); `deadline_name` in the log). Errors are
        logged (one line) and end the iteration; why it ended early goes in `ended`
        (`COPY_ENDS`). With `grant`, it is presented instead of this daemon's token."""

        def theirs(info: dict[str, Any]) -> list[Chunk] | None:
            planned = plan_chunks(
                prompt.tokens,
                block_size=int(info["block_size"]),
                cuts=prompt.cuts,
                root=bytes.fromhex(info["root"]),
                salt=prompt.salt,
                # The run this daemon shares with a fleet-wide warm prompt, the peer too.
                shared=frozenset(c.key for c in chunks),
            )
            if [(c.start, c.end) for c in planned] != [(c.start, c.end) for c in chunks]:
                log.warning("peer %s plans this prompt differently; not copying", url)
                return None
            return planned

        yield from self._copy(url, theirs, start, deadline, deadline_name, ended, grant)

    def fetch_chain(
        self,
        url: str,
        root: bytes,
        chunks: list[Chunk],
        deadline: float,
        deadline_name: str,
        grant: str | None = None,
    ) -> Iterator[tuple[int, kv.BlockPayload]]:
        """As `fetch`, for a chain of blocks named by key (a drain handoff: the router
        knows the keys, not the tokens); only from a peer with the same key root."""

        def same_root(info: dict[str, Any]) -> list[Chunk] | None:
            if info.get("root") != root.hex():
                log.warning("peer %s keys its blocks under another root; not copying", url)
                return None
            return chunks

        yield from self._copy(url, same_root, 0, deadline, deadline_name, None, grant)

    def _copy(
        self,
        url: str,
        plan: Callable[[dict[str, Any]], list[Chunk] | None],
        start: int,
        deadline: float,
        deadline_name: str,
        ended: list[str] | None,
        grant: str | None,
    ) -> Iterator[tuple[int, kv.BlockPayload]]:
        """Verified payloads of `plan(peer info)[start:]`, in order; errors logged."""
        why = _end(ended)
        headers = self.headers
        if grant is not None:
            headers = {k: v for k, v in headers.items() if k != "Authorization"}
            headers[GRANT_HEADER] = grant
        try:
            with httpx.Client(base_url=url, headers=headers, verify=self.verify) as http:
                info = self._info(http, url, deadline)
                theirs = plan(info) if info is not None else None
                if theirs is None:
                    why("refused")
                    return
                index = start
                while index < len(theirs):
                    batch = theirs[index : index + BATCH]
                    got = 0
                    for data in self._stream(http, batch, deadline):
                        yield index, self.codec.from_bytes(data, batch[got])
                        got += 1
                        index += 1
                    if got < len(batch):  # the peer does not have the rest
                        why("lacking")
                        return
        except DeadlinePassed:
            why("deadline")
            _abandoned(url, _past(deadline, deadline_name))
        except PeerLimit as exc:
            why("limit")
            _abandoned(url, str(exc))
        except (
            httpx.HTTPError,
            FrameError,
            BlockError,
            LookupError,
            ValueError,
            TypeError,
            OverflowError,  # e.g. "block_size": Infinity
        ) as exc:
            if isinstance(exc, httpx.TimeoutException) and time.monotonic() >= deadline:
                why("deadline")  # the read's timeout was cut to the deadline
                _abandoned(url, _past(deadline, deadline_name))
            else:
                why("error")
                log.warning("copying blocks from peer %s stopped: %s", url, exc)

    def _timeout(self, deadline: float) -> httpx.Timeout:
        left = deadline - time.monotonic()
        if left <= 0:
            raise DeadlinePassed()
        return httpx.Timeout(min(self.timeout_s, left), connect=min(5.0, left))

    def _info(self, http: httpx.Client, url: str, deadline: float) -> dict[str, Any] | None:
        path = "/v1/cache/fingerprint"
        with http.stream("GET", path, timeout=self._timeout(deadline)) as r:
            if r.status_code != 200:
                text = b"".join(_head(r, ERROR_BODY_MAX_BYTES, deadline))
                granted = " to the grant" if GRANT_HEADER in http.headers else ""
                log.warning(
                    "peer %s: GET %s answered %d%s (the blocks are prefilled): %s",
                    url,
                    path,
                    r.status_code,
                    granted,
                    text.decode(errors="replace")[:200],
                )
                return None
            body = b"".join(_capped(r, FINGERPRINT_MAX_BYTES, deadline, f"GET {path}"))
        try:
            info = json.loads(body)
        except RecursionError as exc:
            raise ValueError(f"GET {path}: nested too deeply") from exc
        if not isinstance(info, dict):
            raise ValueError(f"GET {path} answered a {type(info).__name__}, not an object")
        if info.get("fingerprint") != self.codec.fingerprint:
            log.warning(
                "peer %s serves another model or configuration (fingerprint %s, ours %s); "
                "not copying",
                url,
                info.get("fingerprint"),
                self.codec.fingerprint,
            )
            return None
        return info

    def _stream(self, http: httpx.Client, batch: list[Chunk], deadline: float) -> Iterator[bytes]:
        params = {
            "keys": ",".join(c.key.hex() for c in batch),
            "fingerprint": self.codec.fingerprint,
        }
        what = "GET /v1/cache/blocks"
        timeout = self._timeout(deadline)
        with http.stream("GET", "/v1/cache/blocks", params=params, timeout=timeout) as r:
            if r.status_code != 200:
                text = b"".join(_head(r, ERROR_BODY_MAX_BYTES, deadline))
                raise httpx.HTTPStatusError(
                    f"{what} answered {r.status_code}: {text.decode(errors='replace')[:200]}",
                    request=r.request,
                    response=r,
                )
            longest = self.codec.max_block_bytes(max(c.size for c in batch))
            cap = sum(FRAME_HEADER_BYTES + self.codec.max_block_bytes(c.size) for c in batch)
            frames = read_frames(_capped(r, cap, deadline, what), longest)
            for _, data in zip(batch, frames):  # what was asked for, and no more
                yield data


# Why a copy ended before its last block: the peer lacked the rest, refused (another
# fingerprint or root, a plan of its own, an error status), sent something wrong or went
# away, or was past a byte cap or the deadline.
COPY_ENDS = ("lacking", "refused", "error", "limit", "deadline")


def _end(ended: list[str] | None) -> Callable[[str], None]:
    return ended.append if ended is not None else lambda _: None


def _abandoned(url: str, why: str) -> None:
    log.warning("copying blocks from peer %s abandoned (the rest is prefilled): %s", url, why)


def _past(deadline: float, name: str) -> str:
    late = time.monotonic() - deadline
    return f"{name} passed {late:.1f}s ago"


def _capped(r: httpx.Response, cap: int, deadline: float, what: str) -> Iterator[bytes]:
    """`r`'s body as it comes; PeerLimit past `cap` bytes or past `deadline`."""
    received = 0
    for piece in r.iter_bytes():
        received += len(piece)
        if received > cap:
            raise PeerLimit(f"{what} sent more than {cap} bytes")
        if time.monotonic() > deadline:
            raise DeadlinePassed()
        yield piece


def _head(r: httpx.Response, limit: int, deadline: float) -> Iterator[bytes]:
    """At most the first `limit` bytes of `r`'s body (the rest is never read)."""
    received = 0
    for piece in r.iter_bytes():
        yield piece[: limit - received]
        received += len(piece)
        if received >= limit or time.monotonic() > deadline:
            return
