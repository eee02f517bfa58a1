"""Per-sequence logits processing (logit bias, penalties, grammar masks, logprobs) in
continuous batching: each sequence keeps its own processors, batch neighbours do not
change its output, and a cache hit changes nothing (greedy)."""

from __future__ import annotations

import json
import random

import jsonschema
import mlx.core as mx

from support.engine import greedy, request, run, tokens_of
from warmfleet_daemon.engine.grammar import json_schema_grammar
from warmfleet_daemon.engine.processors import SequenceProcessors

SCHEMA = {
    "type": "object",
    "properties": {"level": {"enum": ["low", "high"]}, "ok": {"type": "boolean"}},
    "required": ["level", "ok"],
    "additionalProperties": False,
}


def params(tiny) -> dict[str, object]:
    """One request per kind of processing, each on its own prompt."""
    return {
        "plain": greedy(16),
        "bias": greedy(16, logit_bias=((100, 30.0),)),
        "presence": greedy(16, logit_bias=((100, 30.0),), presence_penalty=40.0),
        "frequency": greedy(16, logit_bias=((100, 30.0),), frequency_penalty=5.0),
        "repetition": greedy(16, repetition_penalty=1.5),
        "grammar": greedy(40, grammar=json_schema_grammar(SCHEMA)),
        "logprobs": greedy(16, logprobs=5),
    }


def prompts(seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(100, 49000) for _ in range(70)]


def test_processors_change_the_output_and_hold_in_a_batch_and_on_a_cache_hit(
    tiny, make_engine
) -> None:
    kinds = params(tiny)
    tokens = prompts()
    alone = {}
    for kind, sampling in kinds.items():
        engine = make_engine(tiny, block_size=16)
        alone[kind] = tokens_of(run(engine, request(tokens, sampling=sampling))[0])
    # What the processors do: the bias makes token 100 win; the presence penalty lets
    # it win once, the frequency penalty (5 a time) a few times; the grammar gives a
    # valid document; logprobs alone change nothing.
    assert alone["bias"] == [100] * 16
    assert alone["presence"][0] == 100 and 100 not in alone["presence"][1:]
    wins = alone["frequency"].count(100)
    assert 1 < wins < 16 and alone["frequency"][:2] == [100, 100]
    assert alone["logprobs"] == alone["plain"]
    document = tiny.tokenizer.decode(
        [t for t in alone["grammar"] if t not in tiny.tokenizer.eos_token_ids]
    )
    jsonschema.validate(json.loads(document), SCHEMA)

    # All of them in one batch, twice: cold, then with the whole prompt cached.
    engine = make_engine(tiny, block_size=16)
    for _ in range(2):
        events = run(engine, *(request(tokens, sampling=s) for s in kinds.values()))
        assert {k: tokens_of(e) for k, e in zip(kinds, events)} == alone
    assert events[0][-1].usage.cached_tokens == len(tokens)


def test_logprobs_are_those_of_the_sampled_tokens(tiny, make_engine) -> None:
    engine = make_engine(tiny)
    events = run(engine, request(prompts(1), sampling=greedy(8, logprobs=3)))[0]
    entries = [e for event in events for e in event.logprobs]
    assert [e.token for e in entries] == tokens_of(events)[: len(entries)]
    for entry in entries:  # greedy: the sampled token is the most likely one
        assert entry.top[0] == (entry.token, entry.logprob) and len(entry.top) == 3
        assert entry.logprob <= 0 and [lp for _, lp in entry.top] == sorted(
            (lp for _, lp in entry.top), reverse=True
        )


def test_penalties_follow_openai_and_vllm() -> None:
    """Presence and frequency count the completion's tokens (frequency once per
    occurrence); repetition (a factor) counts the prompt's too; the row given is not
    modified."""
    row = mx.array([[2.0, -2.0, 2.0, 2.0]])
    procs = SequenceProcessors(
        greedy(8, presence_penalty=0.5, frequency_penalty=0.25, repetition_penalty=2.0),
        (0, 1),
        None,
    )
    assert procs.process(row).tolist() == [[1.0, -4.0, 2.0, 2.0]]
    procs.accept(2)
    procs.accept(2)
    assert procs.process(row).tolist() == [[1.0, -4.0, 0.0, 2.0]]
    assert row.tolist() == [[2.0, -2.0, 2.0, 2.0]]


def test_a_failing_processor_fails_its_sequence_alone(tiny, make_engine) -> None:
    engine = make_engine(tiny)
    tokens = prompts(2)
    expected = tokens_of(run(make_engine(tiny), request(tokens))[0])
    bad, good = [], []
    engine.submit(request(tokens, sampling=greedy(12, logprobs=1)), bad.append)

    processors = engine.scheduler.inbox[-1].processors
    works, calls = processors.process, []

    def boom(row):  # fails in the third decode step, batched with `good`
        calls.append(row)
        if len(calls) == 4:
            raise RuntimeError("processor bug")
        return works(row)

    processors.process = boom
    engine.submit(request(tokens), good.append)
    engine.run_until_idle()
    assert bad[-1].finish_reason == "error" and "processor bug" in bad[-1].error
    assert len(tokens_of(bad)) >= 2
    assert good[-1].finish_reason == "length" and tokens_of(good) == expected
