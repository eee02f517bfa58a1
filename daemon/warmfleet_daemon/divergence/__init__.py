"""Where prompts stop sharing their prefix, and why: the analysis behind `warmfleet
audit` and the daemon's live cache diagnostics. Plain Python over token sequences (no
mlx); the caller passes a `decode` function for the text.

Prompts are taken in arrival order. The longest prefix a prompt shares with any earlier
one is what an unbounded prefix cache could serve it (a radix tree finds it and the
earlier prompt it matched). Where that match ends inside the prompt's *prefix* (its
static part: everything before its last message, at most `prefix_tokens` tokens) is its
first divergence. The two prompts are then diffed to find every region that differs,
and the text there is classified: a date or time, a UUID or other ID, a number or
version, the same blocks in another order, other text, or a new prompt (different
content from there on, such as another agent: not a template mistake).

The package: `analysis` (analyze: the pass over the prompts, and the aggregation into
divergence points), `compare` (two prompts diffed into varying fields), `classify` (what
a field is), `advice` (the findings' text), `radix` (the prefix index), `report` (the
result types).
"""

from warmfleet_daemon.divergence.analysis import Decode, analyze
from warmfleet_daemon.divergence.classify import classify, reordered_blocks
from warmfleet_daemon.divergence.report import (
    DivergencePoint,
    DivergenceReport,
    Finding,
    Kind,
    PromptTokens,
)

__all__ = [
    "Decode",
    "DivergencePoint",
    "DivergenceReport",
    "Finding",
    "Kind",
    "PromptTokens",
    "analyze",
    "classify",
    "reordered_blocks",
]
