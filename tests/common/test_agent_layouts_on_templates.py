"""The coding agents' layouts on the chat templates Mac users run (the README's table
"The agents' layouts on each template family"): for each family's real template and
tokenizer (tests/support/chat_templates.py) and each agent's multi-turn session as the
agent sends it (tests/support/agent_sessions.py), every turn renders through the daemon's
PromptBuilder (no template error: no 400) and each turn's prompt tokens are a prefix of
the next turn's, so the prefix cache serves the whole previous turn. Where a template
itself rewrites history on the next turn, the prompts part exactly where it does so.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from support import agent_sessions, chat_templates
from support.chat_templates import FAMILIES, Family
from warmfleet_common.prompts import PromptBuilder, RenderedPrompt
from warmfleet_common.role_rules import RoleRules, short_call_id

pytestmark = pytest.mark.skipif(
    not chat_templates.available(),
    reason="the chat template wheels are fetched by scripts/setup.sh --test-tools",
)

# Where a family's own template makes turn N+1 render turn N's prompt differently: the
# token of turn N's prompt where they part, by turn pair (0: turn 1 -> turn 2), or for
# every pair (None).
TEMPLATE_BREAKS: dict[tuple[str, str], dict[int | None, str]] = {
    # GLM opens thinking in the generation prompt and writes past turns as `</think>`.
    **{("GLM", a): {None: "<think>"} for a in agent_sessions.AGENTS},
    # gpt-oss drops the analysis (Claude Code's text before a tool call) once a final
    # answer follows.
    ("gpt-oss", "Claude Code"): {1: "<|channel|>"},
    # Mistral Small 3.2 writes the tool list before the last user message.
    **{
        ("Mistral Small 3.2", a): {1: "[AVAILABLE_TOOLS]", 3: "[AVAILABLE_TOOLS]"}
        for a in agent_sessions.AGENTS
    },
}

# What each template refuses, as the PromptBuilder finds it: where the daemon adapts.
REFUSED = {
    "gpt-oss": RoleRules(system_anywhere=False),  # it drops them: folded, they are seen
    "Devstral": RoleRules(system_anywhere=False),
    "Mistral Small 3.2": RoleRules(False, False, True),
    "Gemma 3": RoleRules(system_anywhere=False, consecutive_users=False),
}


@pytest.fixture(scope="module", params=FAMILIES, ids=[f.name for f in FAMILIES])
def family(request: pytest.FixtureRequest) -> tuple[Family, PromptBuilder]:
    spec: Family = request.param
    return spec, PromptBuilder(chat_templates.tokenizer(spec))


def _render(prompts: PromptBuilder, turn: agent_sessions.Turn) -> RenderedPrompt:
    return prompts.chat(turn.messages, turn.tools, template_kwargs=turn.template_kwargs)


def _shared(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


@pytest.mark.parametrize("agent", list(agent_sessions.AGENTS))
def test_every_turn_renders_and_keeps_the_previous_turn_as_its_prefix(
    family: tuple[Family, PromptBuilder], agent: str
) -> None:
    spec, prompts = family
    rendered = [_render(prompts, turn) for turn in agent_sessions.AGENTS[agent]()]
    breaks = TEMPLATE_BREAKS.get((spec.name, agent), {})
    for pair, (before, after) in enumerate(itertools.pairwise(rendered)):
        shared = _shared(before.tokens, after.tokens)
        where = breaks.get(pair, breaks.get(None))
        context = f"{spec.name}, {agent}, turn {pair + 1} -> {pair + 2}"
        if where is None:
            assert shared == len(before.tokens), (
                f"{context}: the prompts part at token {shared} of {len(before.tokens)}: "
                f"{prompts.decode(before.tokens[shared : shared + 20])!r} became "
                f"{prompts.decode(after.tokens[shared : shared + 20])!r}"
            )
        else:
            assert prompts.decode(before.tokens[shared : shared + 1]) == where, context
            if where == "<think>":  # only the generation prompt's last token
                assert shared == len(before.tokens) - 1, context


def test_opencode_title_request_renders(family: tuple[Family, PromptBuilder]) -> None:
    _, prompts = family
    (turn,) = agent_sessions.opencode_title()
    text = prompts.decode(_render(prompts, turn).tokens)
    assert "Generate a title" in text and '"list the files here"' in text


def test_the_daemon_adapts_only_the_templates_that_refuse_a_layout(
    family: tuple[Family, PromptBuilder],
) -> None:
    spec, prompts = family
    assert prompts.role_rules == REFUSED.get(spec.name, RoleRules())


def test_a_system_message_mid_conversation_stays_in_place(
    family: tuple[Family, PromptBuilder],
) -> None:
    """Claude Code's environment (a system message after the user's words) and its later
    reminders: rendered where they were sent, as a system turn or folded into the user's
    turn, never moved to the top (the prompt's start is the same with and without)."""
    spec, prompts = family
    turns = agent_sessions.claude_code()
    first, later = _render(prompts, turns[0]), _render(prompts, turns[2])
    text = prompts.decode(later.tokens)
    words, environment = text.index("say hi"), text.index("# Environment")
    reminder = text.index("The task tools haven't been used")
    assert words < environment < text.index("a.txt") < text.index("Show it") < reminder
    system_prompt = turns[0].messages[0]["content"]
    assert text.index(system_prompt[:60]) < words
    if spec.name in REFUSED:  # folded into the user's turn: the same turn as the words
        between = prompts.decode(first.tokens)[
            prompts.decode(first.tokens).index("say hi") : prompts.decode(first.tokens).index(
                "# Environment"
            )
        ]
        assert between == "say hi\n\n"


def test_refused_layouts_raised_template_errors_before() -> None:
    """What the daemon answered before it adapted them: a 400 naming the template's
    error. The rules are what turns it around; without them the same messages raise."""
    from warmfleet_common.prompts import PromptError

    gemma = next(f for f in FAMILIES if f.name == "Gemma 3")
    prompts = PromptBuilder(chat_templates.tokenizer(gemma))
    turn = agent_sessions.claude_code()[1]
    prompts.role_rules = RoleRules()  # as sent
    with pytest.raises(PromptError, match="roles must alternate"):
        _render(prompts, turn)


def test_short_call_ids_are_nine_letters_and_digits_and_stable() -> None:
    ids: list[Any] = [short_call_id(f"toolu_{i:024d}") for i in range(200)]
    assert all(len(i) == 9 and i.isalnum() for i in ids)
    assert len(set(ids)) == len(ids)
    assert short_call_id("call_abc") == short_call_id("call_abc")
