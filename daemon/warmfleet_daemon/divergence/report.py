"""What the divergence analysis finds: the report, its points and findings."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class Kind(str, Enum):
    DATE_TIME = "date/time"
    ID = "uuid/id"
    NUMBER = "number/version"
    REORDERED = "reordered blocks"
    OTHER = "other text"
    NEW_PROMPT = "new prompt"  # benign: content never seen before (another agent, say)


@dataclass(frozen=True)
class PromptTokens:
    """One prompt: its tokens and, for chat requests, where its last message starts."""

    tokens: tuple[int, ...]
    static_end: int | None = None  # tokens before the last message's content; None: unknown


@dataclass(frozen=True)
class DivergencePoint:
    position: int  # token index (in the diverging prompts) where they start to differ
    kind: Kind
    requests: int  # prompts that differ here
    first: int  # ... for which it is the first divergence
    reference: str  # what the matched earlier prompt has there (the most common)
    variants: tuple[str, ...]  # what the diverging prompts have there (distinct samples)
    before: str  # decoded text just before the point
    after: str  # ... and just after it, in the reference
    advice: str

    @property
    def is_culprit(self) -> bool:
        return self.kind is not Kind.NEW_PROMPT

    def excerpt(self, width: int = 40) -> str:
        """`…text before ⟦reference⟧ text after…` on one line."""
        before = _one_line(self.before)[-width:]
        after = _one_line(self.after)[:width]
        return f"…{before}⟦{_one_line(self.reference)}⟧{after}…"

    def to_dict(self) -> dict[str, Any]:
        return {
            "position": self.position,
            "kind": self.kind.value,
            "requests": self.requests,
            "first_divergence": self.first,
            "reference": self.reference,
            "variants": list(self.variants),
            "before": self.before,
            "after": self.after,
            "excerpt": self.excerpt(),
            "advice": self.advice,
        }


@dataclass(frozen=True)
class Finding:
    topic: str  # a Kind's value, or "unique prefixes", "hit rate", "block size", "ok"
    message: str
    advice: str

    def to_dict(self) -> dict[str, str]:
        return {"topic": self.topic, "message": self.message, "advice": self.advice}


@dataclass(frozen=True)
class DivergenceReport:
    prompts: int
    prompt_tokens: int
    analyzed: int  # prompts whose divergence was looked for (with an earlier prompt)
    prefix_tokens: int  # the prefix window
    block_size: int
    unique_prefixes: int
    unique_prefix_share: float
    common_prefix_tokens: int  # the most common prefix: its length ...
    common_prefix_prompts: int  # ... and how many prompts have it
    hit_rate: float  # an unbounded cache, token-granular, in arrival order
    block_hit_rate: float  # the same, counting whole blocks only
    theoretical_hit_rate: float  # if every prompt's static prefix had matched
    first_divergence: tuple[tuple[int, int], ...]  # (position, prompts), most common first
    matched: int  # analyzed prompts whose whole prefix matched an earlier prompt
    continuations: int  # ... that extend an earlier prompt (the next turn of a chat)
    new_prompts: int  # ... that diverge into new content (benign)
    diffed: int  # diverging prompts diffed (all, or a sample of max_diffs: counts scaled)
    points: tuple[DivergencePoint, ...]
    findings: tuple[Finding, ...] = field(default=())

    @property
    def culprits(self) -> tuple[DivergencePoint, ...]:
        return tuple(p for p in self.points if p.is_culprit)

    def to_dict(self) -> dict[str, Any]:
        return {
            "prompts": self.prompts,
            "prompt_tokens": self.prompt_tokens,
            "analyzed": self.analyzed,
            "prefix_tokens": self.prefix_tokens,
            "block_size": self.block_size,
            "unique_prefixes": self.unique_prefixes,
            "unique_prefix_share": self.unique_prefix_share,
            "most_common_prefix": {
                "tokens": self.common_prefix_tokens,
                "prompts": self.common_prefix_prompts,
            },
            "hit_rate": self.hit_rate,
            "block_hit_rate": self.block_hit_rate,
            "theoretical_hit_rate": self.theoretical_hit_rate,
            "first_divergence": [
                {"position": pos, "prompts": n} for pos, n in self.first_divergence
            ],
            "matched": self.matched,
            "continuations": self.continuations,
            "new_prompts": self.new_prompts,
            "diffed": self.diffed,
            "points": [p.to_dict() for p in self.points],
            "findings": [f.to_dict() for f in self.findings],
        }


def _one_line(text: str) -> str:
    return text.replace("\r", "").replace("\n", "⏎")
