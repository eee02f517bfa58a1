"""Which cache blocks each backend holds: plain Python, no I/O.

Precise entries come from a daemon's cache events (a snapshot, then stored / evicted /
cleared in sequence order); backends without events get an estimate from the router's
own history (the blocks of requests it sent there, least recently routed forgotten
first). A prediction is what the daemon's engine would reuse: the longest run of the
request's blocks from the first, where the request's final block only counts when it
holds its logits (the engine needs them to sample the first token).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from warmfleet_daemon.chunking import BlockKey
from warmfleet_router.keys import RequestBlocks

DEFAULT_HISTORY_BLOCKS = 200_000


class BlockIndex:
    def __init__(self, history_blocks: int = DEFAULT_HISTORY_BLOCKS) -> None:
        self._precise: dict[str, dict[BlockKey, bool]] = {}  # backend -> key -> logits
        self._history: dict[str, OrderedDict[BlockKey, None]] = {}
        self._history_blocks = history_blocks

    # -- precise: a daemon's cache events ---------------------------------------

    def load_snapshot(self, backend: str, blocks: Iterable[tuple[BlockKey, bool]]) -> None:
        self._precise[backend] = dict(blocks)

    def stored(self, backend: str, key: BlockKey, logits: bool) -> None:
        self._precise.setdefault(backend, {})[key] = logits

    def evicted(self, backend: str, key: BlockKey) -> None:
        self._precise.get(backend, {}).pop(key, None)

    def cleared(self, backend: str) -> None:
        self._precise[backend] = {}

    def is_precise(self, backend: str) -> bool:
        return backend in self._precise

    # -- estimated: the router's own history ------------------------------------

    def routed(self, backend: str, blocks: RequestBlocks) -> None:
        if backend in self._precise:
            return  # the events say what it really stored
        seen = self._history.setdefault(backend, OrderedDict())
        for key in blocks.keys:
            seen[key] = None
            seen.move_to_end(key)
        while len(seen) > self._history_blocks:
            seen.popitem(last=False)

    # -- both ---------------------------------------------------------------------

    def forget(self, backend: str) -> None:
        """Nothing is known about this backend any more (gone, restarted, resyncing)."""
        self._precise.pop(backend, None)
        self._history.pop(backend, None)

    def predict(self, backend: str, blocks: RequestBlocks) -> int:
        """Prompt tokens this backend would serve from its cache."""
        precise = self._precise.get(backend)
        held: dict[BlockKey, bool] | OrderedDict[BlockKey, None] | None
        held = precise if precise is not None else self._history.get(backend)
        if not held:
            return 0
        run = 0
        for key in blocks.keys:
            if key not in held:
                break
            run += 1
        if run and run == len(blocks.keys) and precise is not None and not precise[blocks.keys[-1]]:
            run -= 1
        return blocks.ends[run - 1] if run else 0

    def size(self, backend: str) -> int:
        if backend in self._precise:
            return len(self._precise[backend])
        return len(self._history.get(backend, ()))
