"""The divergence analysis on its own (no model): one token per character, so positions
are character offsets and the expected answers can be read off the strings."""

from __future__ import annotations

import random
import uuid
from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from warmfleet_daemon.divergence import (
    Kind,
    PromptTokens,
    analyze,
    classify,
    reordered_blocks,
)
from warmfleet_daemon.divergence.radix import RadixTree

SYSTEM = (
    "You are Forge, a coding agent for a Go monorepo.\n"
    "Always explain your plan first.\nPrefer small, reviewable changes.\n"
    "Never delete tests to make them pass.\n"
)
QUESTIONS = [
    "Why is CI red?",
    "Fix the flaky cache test.",
    "Rename --dir to --path.",
    "Add a retry.",
]


def encode(text: str) -> tuple[int, ...]:
    return tuple(ord(c) for c in text)


def decode(tokens: Sequence[int]) -> str:
    return "".join(chr(t) for t in tokens)


def chat(system: str, question: str) -> PromptTokens:
    """A toy chat template: the static part is everything before the question."""
    head = f"<system>{system}</system><user>"
    return PromptTokens(encode(f"{head}{question}</user>"), static_end=len(head))


def log(systems: Sequence[str], seed: int = 0) -> list[PromptTokens]:
    rng = random.Random(seed)
    return [chat(s, rng.choice(QUESTIONS)) for s in systems]


# -- the radix tree ----------------------------------------------------------------


@given(st.lists(st.lists(st.integers(0, 3), max_size=12), min_size=1, max_size=30))
def test_radix_tree_finds_the_longest_match_with_any_earlier_sequence(seqs) -> None:
    tree = RadixTree()
    for i, seq in enumerate(seqs):
        expected = max((_lcp(seq, earlier) for earlier in seqs[:i]), default=0)
        lcp, owner = tree.match_and_insert(tuple(seq))
        assert lcp == expected
        if lcp:  # the owner is an earlier sequence that really shares those tokens
            assert owner is not None and owner < i and _lcp(seq, seqs[owner]) >= lcp
        assert tree.has_sequence(tuple(seq), len(seq))


def _lcp(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


# -- what varies ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reference", "variant", "before", "kind"),
    [
        ("2025-01-07T10:31:02Z", "2025-01-08T09:12:45Z", "Current time: ", Kind.DATE_TIME),
        ("10:31", "11:02", "It is ", Kind.DATE_TIME),
        ("07/01/2025", "08/01/2025", "", Kind.DATE_TIME),
        ("1736245862", "1736249999", "ts=", Kind.DATE_TIME),
        ("7", "8", "Today is Tuesday, January ", Kind.DATE_TIME),
        ("Tuesday", "Wednesday", "Today is ", Kind.DATE_TIME),
        (
            "3f2a9c4e-1b7d-4e8a-9c2f-5d6e7f8a9b0c",
            "0c1d2e3f-4a5b-6c7d-8e9f-0a1b2c3d4e5f",
            "",
            Kind.ID,
        ),
        ("sess_8Hk2Lq9", "sess_1Zx7Pw3", "", Kind.ID),
        ("alice", "bob", "You are helping user ", Kind.ID),
        ("4f9a2c1e", "77b0d3aa", "trace ", Kind.ID),
        ("v1.4.2", "v1.5.0", "Agent build ", Kind.NUMBER),
        ("2.3.1-rc1", "2.3.2", "", Kind.NUMBER),
        ("42", "57", "Open tickets: ", Kind.NUMBER),
        ("Paris", "Berlin", "The office is in ", Kind.OTHER),
    ],
)
def test_classify(reference: str, variant: str, before: str, kind: Kind) -> None:
    assert classify(reference, variant, before, "") is kind


def test_reordered_blocks_by_paragraph_and_by_line() -> None:
    docs = [
        "Doc A: refunds need two approvers.",
        "Doc B: ledgers are append-only.",
        "Doc C: webhooks are signed.",
    ]
    assert reordered_blocks("\n\n".join(docs) + "\n\nend", "\n\n".join(docs[::-1]) + "\n\nend")
    assert reordered_blocks("\n".join(docs), "\n".join([docs[1], docs[0], docs[2]]))
    assert not reordered_blocks("\n".join(docs), "\n".join(docs))
    assert not reordered_blocks("\n".join(docs), "Completely different text\nwith other lines")


# -- whole logs, one culprit each ----------------------------------------------------


def test_a_timestamp_in_the_system_prompt() -> None:
    systems = [
        f"Current time: 2025-03-{d:02d}T{d % 24:02d}:{d:02d}:00Z\n{SYSTEM}" for d in range(1, 21)
    ]
    report = analyze(log(systems), decode)
    top = report.culprits[0]
    assert top.kind is Kind.DATE_TIME
    assert top.position == len("<system>Current time: ")  # where the timestamp starts
    assert top.requests == 19 and top.reference.startswith("2025-03-")
    assert report.unique_prefix_share == 1.0
    assert report.hit_rate < 0.2 < 0.7 < report.theoretical_hit_rate
    assert any(f.topic == "date/time" and "token" in f.message for f in report.findings)


def test_a_session_id_after_a_long_shared_part() -> None:
    rng = random.Random(1)
    sessions = [str(uuid.UUID(int=rng.getrandbits(128))) for _ in range(5)]
    systems = [f"{SYSTEM}Session: {rng.choice(sessions)}\nBe brief." for _ in range(30)]
    report = analyze(log(systems), decode)
    top = report.culprits[0]
    assert top.kind is Kind.ID
    assert top.position == len(f"<system>{SYSTEM}Session: ")
    # Requests of a session already seen match in full: only new sessions diverge.
    assert top.requests == 4 and report.matched == 25


def test_a_version_string() -> None:
    systems = [f"{SYSTEM}Agent build v2.{n % 7}.{n % 3}, deployed by CI.\n" for n in range(20)]
    top = analyze(log(systems), decode).culprits[0]
    assert top.kind is Kind.NUMBER
    assert top.position == len(f"<system>{SYSTEM}Agent build ")


def test_reordered_documents() -> None:
    rng = random.Random(2)
    docs = [
        "Doc A: the payments service retries failed charges three times.",
        "Doc B: the ledger is append-only and reconciled nightly.",
        "Doc C: refunds over 500 EUR need a second approver.",
        "Doc D: webhooks are signed with HMAC-SHA256.",
    ]
    systems = []
    for _ in range(20):
        rng.shuffle(docs)
        systems.append(
            SYSTEM + "\nContext:\n\n" + "\n\n".join(docs) + "\n\nAnswer from the documents."
        )
    report = analyze(log(systems), decode)
    top = report.culprits[0]
    assert top.kind is Kind.REORDERED
    assert top.position == len(f"<system>{SYSTEM}\nContext:\n\n")  # the first document
    assert top.reference.startswith("Doc ")


def test_two_culprits_are_both_found() -> None:
    rng = random.Random(3)
    systems = [
        f"Today is 2025-04-{rng.randrange(1, 29):02d}.\n{SYSTEM}User: u{rng.randrange(10**6)}x\n"
        for _ in range(30)
    ]
    kinds = {p.kind: p.position for p in analyze(log(systems), decode).culprits}
    assert kinds[Kind.DATE_TIME] == len("<system>Today is ")
    assert Kind.ID in kinds and kinds[Kind.ID] > len(f"<system>Today is 2025-04-01.\n{SYSTEM}")


def test_a_clean_log_and_several_agents_have_no_culprit() -> None:
    report = analyze(log([SYSTEM] * 20), decode)
    assert not report.culprits and report.matched == 19 and report.unique_prefix_share == 0.05
    assert report.hit_rate == pytest.approx(report.theoretical_hit_rate, abs=0.05)
    assert [f.topic for f in report.findings] == ["ok"]

    agents = [
        SYSTEM,
        "You are Pager, the incident commander's assistant. Summarize alerts in three lines.\n",
        "You are Scribe. Write release notes from the merged pull requests of the week.\n",
    ]
    report = analyze(log([agents[n % 3] for n in range(30)]), decode)
    assert not report.culprits
    assert report.new_prompts == 2 and report.matched == 27


def test_the_next_turn_of_a_chat_is_a_continuation() -> None:
    first = chat(SYSTEM, "Why is CI red?")
    answer = "Because the cache test is flaky."
    history = decode(first.tokens) + f"<assistant>{answer}</assistant><user>"
    second = PromptTokens(encode(history + "Fix it.</user>"), static_end=len(history))
    report = analyze([first, second], decode)
    assert report.continuations == 1 and not report.points


def test_block_hit_rate_counts_whole_blocks_only() -> None:
    prompts = [PromptTokens((*range(40), 1000 + n)) for n in range(3)]
    report = analyze(prompts, decode, block_size=16, prefix_tokens=64)
    total = 3 * 41
    assert report.hit_rate == pytest.approx(2 * 40 / total)
    assert report.block_hit_rate == pytest.approx(2 * 32 / total)


def test_references_count_as_cached_and_targets_limit_the_analysis() -> None:
    systems = [f"Current time: 10:{m:02d}\n{SYSTEM}" for m in range(10)]
    prompts = log(systems)
    warm = [chat(SYSTEM, "").tokens[: prompts[0].static_end]]  # a warmed system prompt
    report = analyze(prompts, decode, references=warm, targets=[3, 4])
    assert report.analyzed == 2
    assert report.culprits[0].requests == 2 and report.culprits[0].kind is Kind.DATE_TIME


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        analyze([], decode, prefix_tokens=0)
    empty = analyze([], decode)
    assert empty.prompts == 0 and empty.hit_rate == 0.0 and not empty.findings
