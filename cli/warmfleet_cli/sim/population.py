"""The numbers an agent-population trace is drawn from, each with where it comes from.

Five kinds of source, said for each number (and copied into every trace's header):

- measured here: this repository's own recordings of the real CLIs (README.md, "Warm
  the coding agents" and "The agents' layouts"; docs/PERFORMANCE.md, "Claude Code and
  Codex: the first request" and "Claude Code's long session"; the trimmed recordings in
  tests/support/data/). Token counts there are the embedded model's tokenizer's.
- published: TraceLab (University of Washington, "TraceLab: Characterizing Coding Agent
  Workloads for LLM Serving", arXiv 2606.30560; https://tracelab.cs.washington.edu),
  4,265 Claude Code and Codex sessions of 43 developers' day-to-day use, and a few
  other public figures, each named where it is used.
- estimated from what was measured here: a number derived from a recording rather
  than read off it (a size in characters turned into tokens, a part of a request
  inferred from the rest).
- configured: a setting of this project's (what `warmfleet up` tells an agent to use),
  not the agent's own behaviour.
- assumption: a number nobody measured that the trace still needs; every one is a
  parameter (`TraceParams`, `warmfleet sim trace --help`) and says "assumption".

Distributions are given as published quantiles and sampled by inverse CDF,
interpolated log-linearly between the quantiles (linearly where one end is 0); the tail
beyond the last quantile given is cut there.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

TRACELAB = "TraceLab (arXiv 2606.30560, tracelab.cs.washington.edu)"
# Characters per token, for turning token sizes into text: measured here on the real
# CLIs' first requests with the embedded tokenizer (Claude Code 2.1.332 with 21 tools:
# 79,790 bytes, 21,149 tokens, 3.8; its environment message: 9,193 characters, 2,332
# tokens, 3.9; Codex 0.171.0: 41,182 bytes, 9,111 tokens, 4.5; docs/PERFORMANCE.md).
CHARS_PER_TOKEN = 4.0


@dataclass(frozen=True)
class Quantiles:
    """A distribution given by (probability, value) points from p=0 to p=1."""

    points: tuple[tuple[float, float], ...]
    source: str

    def sample(self, u: float) -> float:
        """The value at probability `u` (0 <= u < 1)."""
        points = self.points
        for (p0, v0), (p1, v1) in itertools.pairwise(points):
            if u <= p1:
                frac = 0.0 if p1 == p0 else (u - p0) / (p1 - p0)
                if v0 > 0 and v1 > 0:
                    return math.exp(math.log(v0) + frac * (math.log(v1) - math.log(v0)))
                return v0 + frac * (v1 - v0)
        return points[-1][1]


@dataclass(frozen=True)
class AgentShape:
    """What one agent CLI sends: the sizes of its first request's parts and how its
    sessions behave. Sizes in tokens of the embedded tokenizer."""

    name: str  # "claude-code" | "codex"
    version: str  # the version the day starts with
    upgraded: str  # the version after the agent-upgrade event
    system_tokens: int
    tools_tokens: int
    tool_count: int
    environment_tokens: int
    reminder_chars: int  # Claude Code's system-reminder before the user's words (0: none)
    tool_result_cap_tokens: int  # one tool call's result at most
    appended: Quantiles  # tokens a tool-triggered step appends (results and prior output)
    output: Quantiles  # tokens a step generates
    sources: dict[str, str]


CLAUDE_CODE = AgentShape(
    name="claude-code",
    version="2.1.332",
    upgraded="2.1.333",
    system_tokens=1_657,
    tools_tokens=8_490,
    tool_count=12,
    environment_tokens=2_332,
    reminder_chars=580,
    tool_result_cap_tokens=7_500,
    appended=Quantiles(
        ((0, 32), (0.25, 384), (0.5, 857), (0.9, 5_342), (0.99, 7_500), (1, 7_500)),
        f"{TRACELAB}, per-step append tokens, Claude: p25 384, p50 857, p90 5,342 "
        "(its p99 of 232k counts cache misses and first requests: cut here at one tool "
        "result's cap)",
    ),
    output=Quantiles(
        ((0, 16), (0.25, 132), (0.5, 252), (0.9, 1_671), (0.99, 6_571), (1, 6_571)),
        f"{TRACELAB}, per-step output tokens, Claude: p25 132, p50 252, p90 1,671, p99 6,571",
    ),
    sources={
        "first_request": "measured here: Claude Code 2.1.332's first request is 12,756 "
        "tokens: system prompt 1,657, 12 tools 8,490 (the 10,263-token warm prompt), a "
        "~130-token system-reminder (580 characters) before the user's words, then its "
        "environment as a system message after them, 9,193 characters, 2,332 tokens "
        "(docs/PERFORMANCE.md; layout as recorded in tests/support/data/"
        "claude-code-2.1.332.json)",
        "tool_result_cap": "Claude Code's Bash output limit, BASH_MAX_OUTPUT_LENGTH, "
        "30,000 characters by default (anthropics/claude-code#19901): 7,500 tokens",
        "upgrade": "assumption: 2.1.332 -> 2.1.333 keeps the first half of the system "
        "prompt, rewrites the rest, changes one tool's description and adds a tool",
    },
)

CODEX = AgentShape(
    name="codex",
    version="0.171.0",
    upgraded="0.172.0",
    system_tokens=4_490,
    tools_tokens=4_490,
    tool_count=12,
    environment_tokens=110,
    reminder_chars=0,
    tool_result_cap_tokens=10_000,
    appended=Quantiles(
        ((0, 32), (0.25, 406), (0.5, 886), (0.9, 8_310), (0.99, 10_000), (1, 10_000)),
        f"{TRACELAB}, per-step append tokens, Codex: p25 406, p50 886, p90 8,310 (its p99 "
        "of 121k counts cache misses and first requests: cut here at one tool result's cap)",
    ),
    output=Quantiles(
        ((0, 16), (0.25, 70), (0.5, 184), (0.9, 939), (0.99, 3_508), (1, 3_508)),
        f"{TRACELAB}, per-step output tokens, Codex (reasoning included): p25 70, p50 184, "
        "p90 939, p99 3,508",
    ),
    sources={
        "first_request": "measured here: Codex 0.171.0's first request is 9,111-9,144 "
        "tokens (41,182 bytes), of which its developer messages and tools (the warm "
        "prompt) are 8,974-8,983; then an <environment_context> user message and the "
        "user's words (README.md, docs/PERFORMANCE.md; layout as recorded in "
        "tests/support/data/codex-0.171.0.json: no `instructions`, two developer "
        "messages). The split of the 8,980 tokens between developer text and tools is "
        "not recorded here: assumption, half each",
        "tool_result_cap": "Codex's exec_command output budget, 10,000 tokens by default "
        "(its tool schema in the recorded request)",
        "upgrade": "assumption: 0.171.0 -> 0.172.0 keeps the first half of the developer "
        "instructions, rewrites the rest, changes one tool's description and adds a tool",
    },
)

AGENTS = {shape.name: shape for shape in (CLAUDE_CODE, CODEX)}

# -- sessions -----------------------------------------------------------------------------

REQUESTS_PER_SESSION = Quantiles(
    ((0, 1), (0.25, 1), (0.5, 1), (0.9, 18), (0.99, 137), (1, 137)),
    f"{TRACELAB}, requests (user turns) per session: avg 9.2, p25 1, p50 1, p90 18, p99 137",
)
TOOL_STEPS_PER_REQUEST = Quantiles(
    ((0, 0), (0.25, 0), (0.5, 1), (0.9, 20), (0.99, 86), (1, 86)),
    f"{TRACELAB}, tool-initiated steps per request: avg 7.8, p25 0, p50 1, p90 20, p99 86",
)
TOOL_CALLS_PER_STEP = Quantiles(
    ((0, 1), (0.5, 1), (0.9, 2), (0.99, 4), (1, 4)),
    f"{TRACELAB}, tool calls per step: avg 1.2, p50 1, p90 2, p99 4",
)
USER_TOKENS = Quantiles(
    ((0, 8), (0.25, 25), (0.5, 60), (0.9, 400), (0.99, 2_000), (1, 2_000)),
    "assumption: the user's words per request (a line to a pasted log); no published "
    "distribution found",
)
HUMAN_WAIT_S = Quantiles(
    ((0, 3), (0.25, 15), (0.5, 45), (0.9, 300), (0.99, 1_800), (1, 1_800)),
    "assumption: the developer's think time between a response and their next request; "
    "the nearest published figure, a production agentic trace's inter-turn gaps "
    "(tool waits included: p50 1.6 s, p90 44 s, p99 738 s; gitea.gahow.org/gahow/"
    "agentic-kvc scripts/plot_inter_turn_gap.py), mixes tool and human waits",
)
TOOL_WAIT_S = Quantiles(
    ((0, 0.05), (0.25, 0.3), (0.5, 1.0), (0.9, 10), (0.99, 60), (1, 60)),
    f"assumption: a tool's run time between a response and the step its result starts; "
    f"consistent with {TRACELAB}'s Codex tool calls, 5.9 s each on average "
    "(418.1 h over 253k timed calls)",
)
SESSIONS_PER_DAY = (
    4.2,
    "published: one developer's month of Claude Code, 101 sessions in 24 working days "
    "(briworkman.dev/blog/i-logged-every-claude-code-session-for-a-month); Poisson per "
    "developer and day",
)
CLAUDE_SHARE = (
    0.63,
    f"{TRACELAB}: 2,676 of its 4,265 sessions are Claude Code's, 1,589 Codex's",
)
SESSION_STARTS = "assumption: sessions start uniformly over the working hours"
COMPACTION: dict[str, tuple[float, str]] = {
    "instruction_tokens": (
        1_750,
        "estimated from what was measured here: Claude Code's compaction request is the "
        "whole conversation and a ~7 KB instruction to summarise it (docs/PERFORMANCE.md, "
        "Claude Code's long session), 7 KB taken as ~1,750 tokens at ~4 characters a token",
    ),
    "summary_tokens": (
        700,
        "estimated from what was measured here: the request after a compaction carries "
        "~3,000 new tokens, the summary, the date, the user's words and a 9 KB system "
        "message (2,332 tokens); the summary is taken as what is left (docs/PERFORMANCE.md)",
    ),
    "compact_at": (
        0.75,
        "configured: the threshold `warmfleet up`'s ready block sets for Claude Code "
        "(its own default compacts later), seen at work here: it compacted at 24,000 tokens "
        "of a 32,768-token context with those settings (docs/PERFORMANCE.md); Codex assumed "
        "alike",
    ),
}
SERVICE_TIME: dict[str, tuple[float, str]] = {
    "ttft_s": (
        2.0,
        f"{TRACELAB}: Codex's residual TTFT 1.5-2.9 s; only places open-loop times (`t`); "
        "a closed-loop replay uses `gap` after each response instead",
    ),
    "decode_tokens_per_s": (
        50.0,
        f"{TRACELAB}: Claude's median decode speed 50-54 tokens/s; as ttft_s",
    ),
}
