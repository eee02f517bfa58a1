"""Copy warm blocks from a peer daemon with the same fingerprint (HTTP client side).

The peer's block keys hang off its own root (the model's path differs between
machines), so the client asks for its root, plans the prompt's chunks under it (the
same spans: the plan depends only on tokens, cuts and block size, which the
fingerprint covers) and requests them in small batches. Each block is verified before
it is handed on; any failure ends the copy there and the rest is prefilled.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import httpx

from warmfleet_common.chunking import Chunk, plan_chunks
from warmfleet_common.prompts import RenderedPrompt
from warmfleet_daemon.engine import kv
from warmfleet_daemon.kvtransfer.codec import BlockCodec, BlockError
from warmfleet_daemon.kvtransfer.wire import FrameError, read_frames

log = logging.getLogger(__name__)

BATCH = 16  # blocks per request: bounds the URL length and what one response streams
MAX_KEYS = 256  # per request, on the serving side


class PeerClient:
    def __init__(self, codec: BlockCodec, *, token: str | None, timeout_s: float = 30.0) -> None:
        self.codec = codec
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.timeout = httpx.Timeout(timeout_s, connect=5.0)

    def fetch(
        self, url: str, prompt: RenderedPrompt, chunks: list[Chunk], start: int
    ) -> Iterator[tuple[int, kv.BlockPayload]]:
        """Verified payloads of `chunks[start:]`, in order, as far as the peer has them.
        Errors are logged (one line) and end the iteration."""
        try:
            with httpx.Client(base_url=url, headers=self.headers, timeout=self.timeout) as http:
                info = self._info(http, url)
                if info is None:
                    return
                theirs = plan_chunks(
                    prompt.tokens,
                    block_size=int(info["block_size"]),
                    cuts=prompt.cuts,
                    root=bytes.fromhex(info["root"]),
                )
                if [(c.start, c.end) for c in theirs] != [(c.start, c.end) for c in chunks]:
                    log.warning("peer %s plans this prompt differently; not copying", url)
                    return
                index = start
                while index < len(chunks):
                    batch = theirs[index : index + BATCH]
                    got = 0
                    for data in self._stream(http, batch):
                        yield index, self.codec.from_bytes(data, batch[got])
                        got += 1
                        index += 1
                    if got < len(batch):  # the peer does not have the rest
                        return
        except (httpx.HTTPError, FrameError, BlockError, KeyError, ValueError) as exc:
            log.warning("copying blocks from peer %s stopped: %s", url, exc)

    def _info(self, http: httpx.Client, url: str) -> dict[str, Any] | None:
        r = http.get("/v1/cache/fingerprint")
        if r.status_code != 200:
            log.warning("peer %s: GET /v1/cache/fingerprint answered %d", url, r.status_code)
            return None
        info: dict[str, Any] = r.json()
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

    def _stream(self, http: httpx.Client, batch: list[Chunk]) -> Iterator[bytes]:
        params = {
            "keys": ",".join(c.key.hex() for c in batch),
            "fingerprint": self.codec.fingerprint,
        }
        with http.stream("GET", "/v1/cache/blocks", params=params) as r:
            if r.status_code != 200:
                r.read()
                raise httpx.HTTPStatusError(
                    f"GET /v1/cache/blocks answered {r.status_code}: {r.text[:200]}",
                    request=r.request,
                    response=r,
                )
            longest = max(c.size for c in batch)
            yield from read_frames(r.iter_bytes(), self.codec.max_block_bytes(longest))
