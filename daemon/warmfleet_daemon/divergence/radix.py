"""The prefix index of the analysis: token sequences in a compressed trie."""

from __future__ import annotations

from typing import Any


class RadixTree:
    """Token sequences in a compressed trie: for each new sequence, the longest prefix
    it shares with any sequence inserted before, and one such sequence. An edge is
    (owner, start, end, children): the owner's tokens [start, end)."""

    def __init__(self) -> None:
        self._sequences: list[tuple[int, ...]] = []
        self._root: dict[int, list[Any]] = {}
        self._ends: set[tuple[int, int]] = set()  # (length, hash) of every sequence

    @property
    def size(self) -> int:
        return len(self._sequences)

    def sequence(self, index: int) -> tuple[int, ...]:
        return self._sequences[index]

    def has_sequence(self, seq: tuple[int, ...], length: int) -> bool:
        """Whether a sequence equal to seq[:length] was inserted (a prompt ended there)."""
        return (length, hash(seq[:length])) in self._ends

    def match_and_insert(self, seq: tuple[int, ...]) -> tuple[int, int | None]:
        index = len(self._sequences)
        self._sequences.append(seq)
        self._ends.add((len(seq), hash(seq)))
        children, pos, owner = self._root, 0, None
        while pos < len(seq):
            edge = children.get(seq[pos])
            if edge is None:
                children[seq[pos]] = [index, pos, len(seq), {}]
                return pos, owner
            edge_owner, start, end, kids = edge
            label = self._sequences[edge_owner]
            k = _shared(label, start, end, seq, pos)
            owner = edge_owner
            if k == end - start:
                pos += k
                children = kids
                continue
            # Split the edge where the new sequence leaves it.
            edge[2], edge[3] = start + k, {label[start + k]: [edge_owner, start + k, end, kids]}
            pos += k
            if pos < len(seq):
                edge[3][seq[pos]] = [index, pos, len(seq), {}]
            return pos, owner
        return pos, owner


def _shared(label: tuple[int, ...], start: int, end: int, seq: tuple[int, ...], pos: int) -> int:
    """How many tokens of label[start:end] match seq from pos."""
    n = min(end - start, len(seq) - pos)
    if label[start : start + n] == seq[pos : pos + n]:
        return n
    return next(i for i in range(n) if label[start + i] != seq[pos + i])
