"""Decode: one token for every decoding sequence per step, in one batched forward where
the model allows it (the path `probe.choose_decode_path` chose), then sampling (through
each sequence's processors when it has any), stop strings, limits, and the events.

On the CPU, decoding sequences keep their KV in rows of shared per-layer buffers
(`decode_batch`); `decoding` mirrors those rows, so a sequence that leaves swaps the
last row into its place.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Protocol, cast

import mlx.core as mx

from warmfleet_daemon.engine import attention, decode_batch, head
from warmfleet_daemon.engine.probe import DecodePath
from warmfleet_daemon.engine.requests import Event
from warmfleet_daemon.engine.sequence import SequenceState

log = logging.getLogger(__name__)

_CLEAR_EVERY = 256  # decode steps between releases of MLX's buffer cache


class Finish(Protocol):
    """What ends a sequence (the engine's: it knows every queue and the observers)."""

    def __call__(
        self,
        seq: SequenceState,
        reason: str,
        text: str,
        token: int | None = None,
        error: str | None = None,
    ) -> None: ...


class Decoder:
    def __init__(
        self,
        logits: head.Head,
        path: DecodePath,
        *,
        on_gpu: bool,
        eos: set[int],
        context_length: int,
        finish: Finish,
    ) -> None:
        self.logits = logits
        self.path = path
        self.on_gpu = on_gpu
        self.eos = eos
        self.context_length = context_length
        self.finish = finish
        self.decoding: list[SequenceState] = []
        self.steps = 0
        self.generated_total = 0

    @property
    def rows(self) -> decode_batch.DecodeBatch | None:
        """The CPU's decode batch, or None (Metal, or a model that cannot batch)."""
        return self.path.rows

    def start(self, seq: SequenceState) -> None:
        """A prompt fully prefilled: its first token, then (if it goes on) a row."""
        self.decoding.append(seq)
        assert seq.final_logits is not None
        token = self.sample([seq], seq.final_logits)[0]
        seq.final_logits = None
        self.accept(seq, token, time.perf_counter())
        if self.path.rows is not None and seq in self.decoding:
            assert seq.caches is not None and len(self.path.rows) == len(self.decoding) - 1
            self.path.rows.admit(seq.caches)
            seq.caches = None  # its KV lives in the decode batch's row now

    def step(self) -> None:
        seqs = list(self.decoding)
        inputs = mx.array([[s.next_input] for s in seqs])
        if self.path.rows is not None:
            logits = self._decode_rows(inputs)
        elif len(seqs) == 1:  # the same arithmetic as a batch of one, with fewer ops
            logits = self.logits(inputs, seqs[0].caches)
        elif self.path.batched:
            logits = self._in_row_groups(
                len(seqs), lambda i, j: self._sequence_batch_logits(inputs[i:j], seqs[i:j])
            )
        else:  # caches that cannot be decoded side by side: one forward each
            logits = mx.concatenate(
                [self.logits(inputs[i : i + 1], s.caches) for i, s in enumerate(seqs)]
            )
        self.take(seqs, self.sample(seqs, logits))

    def take(self, seqs: list[SequenceState], token_ids: list[int]) -> None:
        """The end of a step, whatever computed it: each sequence takes its token."""
        now = time.perf_counter()
        self.steps += 1
        if self.steps % _CLEAR_EVERY == 0:
            mx.clear_cache()
        for seq, token in zip(seqs, token_ids, strict=True):
            self.accept(seq, token, now)

    def leave(self, seq: SequenceState) -> None:
        row = self.decoding.index(seq)
        rows = self.path.rows
        if rows is None or row >= len(rows):
            self.decoding.remove(seq)  # not admitted (it finished on its first token)
            return
        moved = rows.release(row)
        if moved is not None:  # the last row took its place: mirror that
            self.decoding[row] = self.decoding[moved]
        self.decoding.pop()

    # -- the forward ------------------------------------------------------------------

    def _in_row_groups(self, count: int, logits_of: Callable[[int, int], mx.array]) -> mx.array:
        """`logits_of(i, j)` for rows [i, j) of one decode step through mlx-lm's forward: on
        the CPU in groups of at most head.ROW_GROUP rows, since past that many OpenBLAS
        changes a row's result with its neighbours, and a batch must not."""
        step = count if self.on_gpu else head.ROW_GROUP
        parts = [logits_of(i, min(i + step, count)) for i in range(0, count, step)]
        return mx.concatenate(parts) if len(parts) > 1 else parts[0]

    def _sequence_batch_logits(self, inputs: mx.array, seqs: list[SequenceState]) -> mx.array:
        """Logits of one decode step of `seqs`, each attending over its own caches."""
        if len(seqs) == 1:  # the same arithmetic as a batch of one, with fewer ops
            return self.logits(inputs, seqs[0].caches)
        layers = [
            attention.SequenceBatch(
                [s.caches[i] for s in seqs],  # type: ignore[index]
                latent=self.path.latent,
            )
            for i in range(len(seqs[0].caches or []))
        ]
        return self.logits(inputs, layers)

    def _decode_rows(self, inputs: mx.array) -> mx.array:
        """Logits (rows, vocab) of one decode step of every row of the decode batch."""
        rows = self.path.rows
        assert rows is not None
        try:
            if self.path.forward is not None:
                logits = self.logits.project(self.path.forward(inputs[:, 0], rows.step_views()))
            else:
                logits = self._in_row_groups(
                    len(rows), lambda i, j: self.logits(inputs[i:j], rows.step_views(i, j))
                )
            mx.eval(logits, rows.buffers())
        except Exception:
            rows.reset()  # its buffers may be half-written; every decoding request fails
            raise
        rows.advance()
        return logits

    # -- sampling and finishing --------------------------------------------------------

    def sample(self, seqs: list[SequenceState], logits: mx.array) -> list[int]:
        """One token per sequence from its row of `logits` (batch, vocab), through the
        sequence's own processors when it has any."""
        if not any(s.processors.active for s in seqs):
            if all(s.request.sampling.greedy for s in seqs):  # one op for the whole batch
                return cast(list[int], mx.argmax(logits, axis=-1).tolist())
            sampled = mx.stack([s.sampler.sample(logits[i]) for i, s in enumerate(seqs)])
            return cast(list[int], sampled.tolist())
        rows = [self._process(s, logits[i : i + 1]) for i, s in enumerate(seqs)]
        tokens = cast(
            list[int], mx.stack([s.sampler.sample(r) for s, r in zip(seqs, rows)]).tolist()
        )
        for seq, row, token in zip(seqs, rows, tokens):
            entry = seq.processors.logprob(row, token)
            if entry is not None:
                seq.pending_logprobs.append(entry)
        return tokens

    @staticmethod
    def _process(seq: SequenceState, row: mx.array) -> mx.array:
        """The sequence's processed (vocab,) row; if its processors fail, the raw row,
        and the sequence fails alone (its batch neighbours go on)."""
        if not seq.processors.active or seq.processing_error is not None:
            return row[0]
        try:
            return seq.processors.process(row)[0]
        except Exception as exc:
            log.exception("logits processing failed for request %s", seq.request.request_id)
            seq.processing_error = f"{type(exc).__name__}: {exc}"
            return row[0]

    def accept(self, seq: SequenceState, token: int, now: float) -> None:
        if seq.processing_error is not None:
            self.finish(seq, "error", "", error=f"logits processing: {seq.processing_error}")
            return
        seq.generated.append(token)
        refused = seq.processors.accept(token) if token not in self.eos else None
        if refused is not None:
            self.finish(seq, "error", "", token, error=f"structured output: {refused}")
            return
        seq.next_input = token
        self.generated_total += 1
        if seq.first_token_at is None:
            seq.first_token_at = now
        params = seq.request.sampling
        if token in self.eos and not params.ignore_eos:
            if seq.pending_logprobs and seq.pending_logprobs[-1].token == token:
                seq.pending_logprobs.pop()  # like its text, EOS is not part of the output
            seq.detokenizer.finalize()
            text = seq.detokenizer.last_segment + seq.stops.flush()
            self.finish(seq, "stop", text, token)
            return
        seq.detokenizer.add_token(token)
        text, stopped = seq.stops.feed(seq.detokenizer.last_segment)
        if stopped:
            self.finish(seq, "stop", text, token)
            return
        at_limit = len(seq.generated) >= params.max_tokens
        at_context = len(seq.tokens) + len(seq.generated) >= self.context_length
        if at_limit or at_context:
            seq.detokenizer.finalize()
            more, _ = seq.stops.feed(seq.detokenizer.last_segment)
            self.finish(seq, "length", text + more + seq.stops.flush(), token)
            return
        seq.pending_tokens.append(token)
        if text:
            seq.sink(Event(text, seq.take_tokens(), logprobs=seq.take_logprobs()))
