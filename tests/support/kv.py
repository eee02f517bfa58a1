"""Prompts, checks and a peer shared by the warm-without-prefill tests."""

from __future__ import annotations

import random
import socket
from pathlib import Path
from urllib.parse import parse_qs, urlparse

from support.engine import request, run, tokens_of
from support.processes import HandlerServer, QuietHandler, free_port
from warmfleet_common.prompts import RenderedPrompt
from warmfleet_daemon.api.routes_kv import _frames
from warmfleet_daemon.engine.core import Engine
from warmfleet_daemon.kvtransfer.transfer import KVTransfer

VOCAB = (100, 49000)
BLOCK = 16


def prompts(seed: int = 5) -> tuple[RenderedPrompt, RenderedPrompt]:
    """A warm prefix (ends at a cut, like warm-up's) and a request that continues it."""
    rng = random.Random(seed)
    prefix = [rng.randrange(*VOCAB) for _ in range(90)]
    question = [rng.randrange(*VOCAB) for _ in range(12)]
    return RenderedPrompt(tuple(prefix), (40,)), RenderedPrompt(
        tuple(prefix + question), (40, len(prefix))
    )


def warm(engine: Engine) -> RenderedPrompt:
    """`prompts()`'s warm prefix, prefilled and pinned in `engine` as warm-up does."""
    prefix, _ = prompts()
    run(engine, request(prefix.tokens, prefix.cuts, prefill_only=True, pin=True))
    return prefix


def unreachable_url() -> str:
    """An http URL on 127.0.0.1 that nobody listens on (a free port)."""
    return f"http://127.0.0.1:{free_port()}"


def from_scratch(engine: Engine, prompt: RenderedPrompt) -> list[int]:
    engine.clear_prefix_cache()
    out = tokens_of(run(engine, request(prompt.tokens, prompt.cuts))[0])
    engine.clear_prefix_cache()
    return out


def answer(engine: Engine, prompt: RenderedPrompt) -> tuple[list[int], int]:
    events = run(engine, request(prompt.tokens, prompt.cuts))[0]
    assert events[-1].usage is not None
    return tokens_of(events), events[-1].usage.cached_tokens


def attached(transfer: KVTransfer) -> KVTransfer:
    """`transfer` with its tiers (the disk, the peer copies) attached to its engine, as
    the daemon's assembly attaches them."""
    for tier in transfer.tiers:
        transfer.engine.attach_tier(tier)
    return transfer


def warm_and_snapshot(engine: Engine, state_dir: Path, budget: int = 64 << 20) -> KVTransfer:
    transfer = KVTransfer(engine, state_dir=state_dir, snapshot_budget_bytes=budget)
    prefix = warm(engine)
    keys = [c.key for c in engine.plan(prefix)]
    transfer.sync_snapshots(keys, [keys])
    assert transfer.snapshots is not None and transfer.snapshots.flush()
    transfer.stop()
    return transfer


class Peer(HandlerServer):
    """GET /v1/cache/fingerprint and /v1/cache/blocks of `transfer`'s engine; with
    `cut_after` blocks, the connection drops halfway through the next block."""

    def __init__(self, transfer: KVTransfer, cut_after: int | None = None, **info: str) -> None:
        self.transfer, self.cut_after, self.info = transfer, cut_after, info
        self.requests: list[str] = []
        peer = self

        class Handler(QuietHandler):
            def do_GET(self) -> None:
                url = urlparse(self.path)
                peer.requests.append(url.path)
                if url.path == "/v1/cache/fingerprint":
                    self.send_json({**peer.transfer.status(), **peer.info})
                    return
                keys = [bytes.fromhex(k) for k in parse_qs(url.query)["keys"][0].split(",")]
                frames = list(_frames(peer.transfer.engine.cache, peer.transfer.codec, keys))
                self.send_response(200)
                self.send_header("Content-Length", str(sum(len(f) for f in frames)))
                self.end_headers()
                if peer.cut_after is None:
                    for f in frames:
                        self.wfile.write(f)
                    return
                for f in frames[: peer.cut_after]:
                    self.wfile.write(f)
                self.wfile.write(frames[peer.cut_after][: len(frames[peer.cut_after]) // 2])
                self.wfile.flush()
                self.connection.shutdown(socket.SHUT_RDWR)  # the peer goes away

        super().__init__(Handler)
