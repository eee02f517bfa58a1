"""Fixtures the engine tests share beyond tests/conftest.py's."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from support.kv import BLOCK, warm
from warmfleet_daemon.engine.core import Engine
from warmfleet_daemon.kvtransfer.transfer import KVTransfer
from warmfleet_daemon.models.loader import LoadedModel


@pytest.fixture
def warm_peer(tiny: LoadedModel, make_engine: Callable[..., Engine]) -> Iterator[KVTransfer]:
    """A transfer whose engine holds `prompts()`'s warm prefix: what a `Peer` serves."""
    engine = make_engine(tiny, block_size=BLOCK)
    transfer = KVTransfer(engine)
    warm(engine)
    yield transfer
    transfer.stop()
