"""The prompt material several benchmarks share: a coding agent's instructions
(PARAGRAPHS, QUESTIONS, system prompts of a given size), stories to write, and coding
agents' long transcripts (tasks, tool calls, tool results) with the asks of their later
turns."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

from harness.client import Turn

PARAGRAPHS = [
    "You are Forge, an autonomous coding agent working inside a large Python and Go "
    "monorepo. You receive tasks from engineers and you complete them by reading files, "
    "running commands and proposing patches.",
    "Always explain your plan before acting. Prefer small, reviewable changes. Never "
    "delete tests to make them pass, and never commit secrets, tokens or credentials.",
    "When a command fails, read its output carefully, state the most likely cause and "
    "try the smallest fix first. If two attempts fail, stop and ask for guidance.",
    "The repository uses Bazel for builds, pytest and go test for tests, ruff and "
    "golangci-lint for linting, and conventional commit messages.",
    "Tool read_file(path, start_line, end_line) returns the text of a file. Tool "
    "search_code(query, path_glob) returns matching lines with their locations. Tool "
    "run_command(cmd, timeout_s) runs a shell command in the sandbox and returns stdout, "
    "stderr and the exit code.",
    "Tool propose_patch(diff, rationale) submits a unified diff for review. Tool "
    "open_issue(title, body, labels) files an issue in the tracker when a task is "
    "blocked by something outside the repository.",
    "Answer in English. Use Markdown code fences for code. Keep summaries under ten "
    "lines unless the engineer asks for detail, and list the files you changed.",
    "Security review checklist: validate inputs at trust boundaries, avoid shell "
    "interpolation of user data, pin dependency versions, and prefer constant-time "
    "comparison for secrets.",
]
QUESTIONS = [
    "Why does the CI job for the payments service time out?",
    "Add a retry with backoff to the HTTP client in pkg/fetch.",
    "Explain what the Bazel target //tools:lint does.",
    "Rename the config flag --cache-dir to --cache-path everywhere.",
    "Find where we parse RFC 3339 timestamps and add tests.",
    "Is the Redis connection pool shared across goroutines?",
]
# Eight long stories to write at once (decode at concurrency 8).
STORY_TOPICS = [
    "dragons", "the sea", "a robot", "Paris", "a garden", "winter", "a train", "the moon",
]  # fmt: skip


def stories(part: int) -> list[list[dict[str, Any]]]:
    """Eight conversations asking for a long story each (`part`: another one each time)."""
    return [
        [{"role": "user", "content": f"Write a long story about {topic}, part {part}."}]
        for topic in STORY_TOPICS
    ]


def system_prompt(tokenizer: Any, target_tokens: int, nonce: str) -> str:
    """~target_tokens of agent instructions; the nonce first, so nothing is shared."""
    rng = random.Random(nonce)
    text = f"Session {nonce}. "
    while len(tokenizer.encode(text)) < target_tokens:
        text += rng.choice(PARAGRAPHS) + "\n\n"
    return text


# -- long agent sessions ------------------------------------------------------------------

FILES = ["pkg/fetch/client.go", "services/payments/api.py", "tools/lint/BUILD", "docs/ops.md"]
COMMANDS = ["pytest -q tests/payments", "go test ./pkg/...", "bazel build //tools:lint"]
CODE = [
    "def retry(fn, attempts=3, backoff=0.5):",
    "    for attempt in range(attempts):",
    "        try:",
    "            return fn()",
    "        except TimeoutError as exc:",
    "            time.sleep(backoff * 2 ** attempt)",
    "func (c *Client) Do(req *http.Request) (*http.Response, error) {",
    "    resp, err := c.inner.Do(req)",
    '    if err != nil { return nil, fmt.Errorf("fetch: %w", err) }',
    "payments_timeout_seconds = int(os.environ.get('PAYMENTS_TIMEOUT', '30'))",
    "class LedgerEntry(BaseModel):",
    "    amount_cents: int",
    "    currency: Literal['EUR', 'USD']",
]
ASKS = [
    "Now run the tests again and tell me what still fails.",
    "Summarize what you changed so far in three lines.",
    "Check whether the retry also covers connection resets.",
    "What is the next file you would read, and why?",
]


@dataclass
class Session:
    messages: list[dict[str, Any]]
    turns: list[Turn] = field(default_factory=list)
    target: int = 0  # the tokens its history was made to hold


def history(tokenizer: Any, rng: random.Random, system: str, target: int, n: int) -> Session:
    """A coding agent's transcript of about `target` tokens: tasks, tool calls (as the
    Hermes convention writes them), tool results (file contents, command output)."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": system},
        {"role": "user", "content": f"Session {n}: the payments CI job times out; fix it."},
    ]
    tokens = len(tokenizer.encode(system)) + 20
    while tokens < target:
        if rng.random() < 0.6:
            path = rng.choice(FILES)
            name, arguments = "read_file", {"path": path}
            body = "\n".join(rng.choice(CODE) for _ in range(rng.randint(20, 60)))
        else:
            cmd = rng.choice(COMMANDS)
            name, arguments = "run_command", {"cmd": cmd}
            body = "\n".join(
                f"FAILED tests/payments/test_api.py::test_{rng.randint(1, 99)} - "
                f"TimeoutError after {rng.randint(1, 60)}s"
                for _ in range(rng.randint(5, 25))
            )
        call = {"name": name, "arguments": arguments}
        said = f"I will {name.replace('_', ' ')} next."
        text = f"{said}\n<tool_call>\n{json.dumps(call)}\n</tool_call>"
        result = f"<tool_response>\n{body}\n</tool_response>"
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": result}]
        tokens += len(tokenizer.encode(text)) + len(tokenizer.encode(result)) + 10
    return Session(messages, target=target)


def transcripts(tokenizer: Any, count: int, min_tokens: int, max_tokens: int) -> list[Session]:
    """`count` sessions of min_tokens-max_tokens each (drawn at random, the same every
    run), one agent's system prompt shared by all."""
    rng = random.Random(20)
    system = "\n\n".join(PARAGRAPHS * 3)
    targets = [rng.randint(min_tokens, max_tokens) for _ in range(count)]
    return [history(tokenizer, rng, system, n, i) for i, n in enumerate(targets)]
