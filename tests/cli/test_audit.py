"""`warmfleet audit` on generated logs, one template mistake each, rendered and tokenized
with the embedded model's template and tokenizer (no weights): the culprit is found at
the token where the varying text starts and classified."""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from warmfleet_cli.audit.analysis import AuditError, audit, read_log
from warmfleet_cli.main import main
from warmfleet_common.prompts import PromptBuilder
from warmfleet_daemon.models.loader import load_gguf_tokenizer_only

BASE = (
    "You are Forge, a coding agent for the Larch monorepo. Explain your plan before acting, "
    "prefer small reviewable changes and never delete tests to make a build pass."
)
QUESTIONS = [
    "Why is CI red on main?",
    "Add a retry to the HTTP client in pkg/fetch.",
    "Rename the --cache-dir flag to --cache-path.",
    "Which services still import pkg/legacyauth?",
]
TOOLS = [
    {"type": "function", "function": {"name": name, "description": f"{name} in the sandbox"}}
    for name in ("read_file", "search_code", "run_command", "propose_patch")
]
Request = dict[str, Any]


@pytest.fixture(scope="module")
def builder() -> PromptBuilder:
    return PromptBuilder(load_gguf_tokenizer_only())


def token_at(builder: PromptBuilder, request: Request, text: str) -> int:
    """The token of the rendered request that holds the first character of `text`."""
    rendered = builder.chat(request["messages"], request.get("tools"))
    assert rendered.text is not None
    offset = rendered.text.index(text)
    return next(
        k
        for k in range(len(rendered.tokens))
        if len(builder.decode(rendered.tokens[: k + 1])) > offset
    )


def request(system: str, rng: random.Random, tools: list[dict[str, Any]] | None = None) -> Request:
    body: Request = {
        "model": "default",
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": rng.choice(QUESTIONS)},
        ],
    }
    if tools:
        body["tools"] = tools
    return body


def write_log(path: Path, requests: list[Request]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in requests))
    return path


# Each case: a request generator (number, rng) and the text whose first token is the
# culprit's position (taken from the first request).
Case = tuple[Callable[[int, random.Random], Request], Callable[[Request], str]]


def timestamp(n: int, rng: random.Random) -> Request:
    stamp = f"2025-03-{1 + n % 28:02d}T{rng.randrange(24):02d}:{rng.randrange(60):02d}Z"
    return request(f"Current date and time: {stamp}\n{BASE}", rng)


def session(n: int, rng: random.Random) -> Request:
    return request(f"{BASE}\nSession: {uuid.UUID(int=rng.getrandbits(128))}\nBe brief.", rng)


def user(n: int, rng: random.Random) -> Request:
    name = rng.choice(["alice", "bob", "carol", "dave"])
    return request(f"{BASE}\nYou are assisting user {name}{rng.randrange(1000)} today.", rng)


def version(n: int, rng: random.Random) -> Request:
    return request(
        f"{BASE}\nAgent build v3.{rng.randrange(40)}.{rng.randrange(10)}, deployed by CI.", rng
    )


def shuffled_tools(n: int, rng: random.Random) -> Request:
    tools = list(TOOLS)
    rng.shuffle(tools)
    return request(BASE, rng, tools)


CASES: dict[str, tuple[Callable[[int, random.Random], Request], str, Callable[[str], str]]] = {
    "timestamp": (timestamp, "date/time", lambda s: s.split("time: ")[1][:4]),
    "session id": (session, "uuid/id", lambda s: s.split("Session: ")[1][:8]),
    "user id": (user, "uuid/id", lambda s: s.split("user ")[1].split()[0]),
    "version": (version, "number/version", lambda s: s.split("Agent build ")[1][:4]),
    "reordered tools": (shuffled_tools, "reordered blocks", lambda s: s.split("<tools>\n")[1][:20]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_culprit_is_found_at_its_token_and_classified(
    case: str, builder: PromptBuilder, tmp_path: Path
) -> None:
    make, kind, marker = CASES[case]
    rng = random.Random(7)
    requests = [make(n, rng) for n in range(24)]
    report, meta = audit(write_log(tmp_path / "log.jsonl", requests))
    assert meta["chat_requests"] == 24 and not meta["skipped_lines"]
    top = report.culprits[0]
    rendered = builder.chat(requests[0]["messages"], requests[0].get("tools"))
    assert rendered.text is not None
    system_text = rendered.text  # the system message as rendered (tools included)
    assert top.kind.value == kind, top
    assert top.position == token_at(builder, requests[0], marker(system_text)), top
    assert report.theoretical_hit_rate > report.hit_rate
    assert any(f.topic == kind for f in report.findings)


def test_clean_logs_have_no_culprit_and_a_high_hit_rate(tmp_path: Path) -> None:
    rng = random.Random(1)
    requests = [request(BASE, rng, TOOLS) for _ in range(20)]
    report, _ = audit(write_log(tmp_path / "clean.jsonl", requests))
    assert not report.culprits and report.matched == 19
    assert report.hit_rate > 0.7 and report.unique_prefix_share == pytest.approx(1 / 20)


def test_rendered_prompts_are_audited_too(builder: PromptBuilder, tmp_path: Path) -> None:
    rng = random.Random(2)
    requests = [timestamp(n, rng) for n in range(12)]
    texts = [builder.chat(r["messages"]).text for r in requests]
    path = tmp_path / "rendered.jsonl"
    path.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in texts))
    report, meta = audit(path, prefix_tokens=64)
    assert meta["rendered_prompts"] == 12
    assert report.culprits[0].kind.value == "date/time"
    assert report.culprits[0].position == token_at(builder, requests[0], "2025-03-")


def test_bad_lines_are_reported_with_their_line_numbers(tmp_path: Path) -> None:
    rng = random.Random(3)
    good = [json.dumps(timestamp(n, rng)) for n in range(5)]
    lines = [
        good[0],
        "{not json",
        good[1],
        json.dumps({"model": "x"}),
        json.dumps({"messages": [{"role": "wizard", "content": "hi"}]}),
        "",
        *good[2:],
    ]
    path = tmp_path / "mixed.jsonl"
    path.write_text("\n".join(lines) + "\n")
    loaded = read_log(path)
    assert [n for n, _ in loaded.errors] == [2, 4, 5]
    assert "not valid JSON" in loaded.errors[0][1]
    assert 'expected "messages"' in loaded.errors[1][1]
    assert "messages.0.role" in loaded.errors[2][1]
    report, meta = audit(path)
    assert report.prompts == 5 and [e["line"] for e in meta["skipped_lines"]] == [2, 4, 5]

    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(AuditError, match="no requests"):
        audit(tmp_path / "empty.jsonl")
    with pytest.raises(AuditError, match="cannot read"):
        audit(tmp_path / "missing.jsonl")


def test_the_cli_prints_a_table_or_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rng = random.Random(4)
    path = write_log(tmp_path / "log.jsonl", [session(n, rng) for n in range(10)] + [{"oops": 1}])  # type: ignore[list-item]
    assert main(["audit", str(path), "--format", "json", "--block-size", "32"]) == 0
    out, err = capsys.readouterr()
    document = json.loads(out)
    assert document["block_size"] == 32 and document["points"][0]["kind"] == "uuid/id"
    assert document["skipped_lines"] == [
        {"line": 11, "error": document["skipped_lines"][0]["error"]}
    ]
    assert f"{path}:11: skipped" in err

    assert main(["audit", str(path)]) == 0
    out, _ = capsys.readouterr()
    for text in (
        "unique prefixes",
        "Divergence points",
        "uuid/id",
        "Findings",
        "1 line(s) skipped",
    ):
        assert text in out
    assert main(["audit", str(tmp_path / "nope.jsonl")]) == 2
    assert "cannot read" in capsys.readouterr().err
