"""The block stream's framing and the push contract's `peers` field (no model)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from warmfleet_common.contract import WarmSetSpec
from warmfleet_daemon.kvtransfer.wire import FrameError, frame, read_frames


def pieces(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


@pytest.mark.parametrize("size", [1, 3, 7, 1000])
def test_frames_survive_any_split_of_the_stream(size: int) -> None:
    blocks = [b"a" * 10, b"", b"xyz" * 50]
    stream = b"".join(frame(b) for b in blocks)
    assert list(read_frames(pieces(stream, size), max_frame=1000)) == blocks


def test_a_stream_cut_mid_block_is_an_error_after_the_whole_blocks() -> None:
    stream = frame(b"first") + frame(b"second")[:-2]
    got: list[bytes] = []
    with pytest.raises(FrameError, match="middle of a block"):
        for block in read_frames(pieces(stream, 4), max_frame=100):
            got.append(block)
    assert got == [b"first"]


def test_an_oversized_frame_is_refused_before_it_is_buffered() -> None:
    with pytest.raises(FrameError, match="exceeds"):
        list(read_frames([frame(b"x" * 101)[:12]], max_frame=100))


def test_peers_are_http_base_urls() -> None:
    prompts = [{"name": "a", "messages": [{"role": "system", "content": "hi"}]}]
    spec = WarmSetSpec.model_validate(
        {"prompts": prompts, "peers": ["http://mac-mini-2.lan:8000/", "https://m3:8443"]}
    )
    assert spec.peers == ["http://mac-mini-2.lan:8000", "https://m3:8443"]
    assert WarmSetSpec.model_validate({"prompts": prompts}).peers == []
    for bad in (["ftp://x"], ["mac-mini:8000"], ["http://a b"], ["http://x"] * 9):
        with pytest.raises(ValidationError, match="peers"):
            WarmSetSpec.model_validate({"prompts": prompts, "peers": bad})
