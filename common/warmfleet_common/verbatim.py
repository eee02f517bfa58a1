"""One render for a message's probes, where the chat template allows it.

`PromptBuilder` finds where a message's content starts by rendering the conversation up
to it once per probe content (twelve), and a coding agent's conversation is long: its
two new cut candidates a turn cost two dozen renders of the whole history (17-37 ms at
16k tokens on an AMD EPYC core, on the router and on every daemon). Most templates
insert a message's content as it is, with nothing before it depending on it: then the
probes' renderings are one rendering with a sentinel content, the sentinel replaced by
each probe. `inserts_verbatim` checks that on sample conversations (every probe, at the
start, after a system prompt, after a user and after an assistant message, with the
request's tools and template arguments), and a template that trims, escapes or looks at
a content in any of them keeps one render per probe. Either way the texts are the same,
so the cuts are too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

SENTINEL = "\ue000warmfleet-probe\ue001"  # private-use characters: no template reads them
# Contents that start with every kind of character a tokenizer may merge with the text
# before it (letters, spaces, newlines, digits, punctuation, non-ASCII).
PROBES = ("x", "X", " x", "  x", "\tx", "\nx", "\n\nx", "1", "!x", "<x", "éx", "\u4e2dx")
SAMPLE_TOOLS = (
    {
        "type": "function",
        "function": {
            "name": "run",
            "description": "Run a command",
            "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
        },
    },
)

Render = Callable[[Sequence[Mapping[str, Any]]], str]  # messages -> text (no generation prompt)

_HEADS: tuple[tuple[Mapping[str, Any], ...], ...] = (
    (),
    ({"role": "system", "content": "You are terse."},),
    ({"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi 42!"}),
    (
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hi 42!"},
        {"role": "assistant", "content": "Hello."},
    ),
)
_ROLE_AFTER = ("user", "user", "assistant", "user")  # the role that follows each head


def probe_texts(render: Render, head: Sequence[Mapping[str, Any]], role: Any) -> list[str] | None:
    """Each probe's rendering of `head` then a `role` message, from one render: None
    when the sentinel does not come out exactly once (render per probe instead)."""
    text = render([*head, {"role": role, "content": SENTINEL}])
    before, found, after = text.partition(SENTINEL)
    if not found or SENTINEL in after:
        return None
    return [before + probe + after for probe in PROBES]


def inserts_verbatim(render: Render) -> bool:
    """Whether every probe renders as the sentinel's rendering with the probe in its place,
    on the sample conversations (a system or user message first, then user, assistant and
    user messages after the others). A template that refuses a sample is not checked
    further: it renders per probe."""
    samples: list[tuple[Sequence[Mapping[str, Any]], str]] = [((), "system")]
    samples += list(zip(_HEADS, _ROLE_AFTER, strict=True))
    try:
        for head, role in samples:
            fast = probe_texts(render, head, role)
            if fast is None:
                return False
            slow = [render([*head, {"role": role, "content": p}]) for p in PROBES]
            if fast != slow:
                return False
    except Exception:  # the template's own refusal of a sample: PromptError and the like
        return False
    return True
