"""Chat rendering with the embedded model's tokenizer and template (no weights)."""

from __future__ import annotations

import pytest

from warmfleet_common.prompts import PromptBuilder, PromptError
from warmfleet_daemon.models.loader import load_gguf_tokenizer_only

SYSTEM = {"role": "system", "content": "You review pull requests for a Go monorepo. " * 5}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "run_tests",
            "description": "Run the test suite of a package",
            "parameters": {"type": "object", "properties": {"package": {"type": "string"}}},
        },
    }
]


@pytest.fixture(scope="module")
def prompts() -> PromptBuilder:
    return PromptBuilder(load_gguf_tokenizer_only())


def test_cuts_sit_just_before_each_message_content(prompts: PromptBuilder) -> None:
    # Before the template's newline: a content starting with whitespace merges with it.
    messages = [
        SYSTEM,
        {"role": "user", "content": "Review #12"},
        {"role": "assistant", "content": "LGTM"},
        {"role": "user", "content": "And #13?"},
    ]
    rendered = prompts.chat(messages)
    starts = [prompts.decode(rendered.tokens[c:]) for c in rendered.cuts]
    assert [s[: 1 + len(m["content"])] for s, m in zip(starts, messages)] == [
        "\n" + m["content"] for m in messages
    ]
    assert prompts.decode(rendered.tokens[: rendered.cuts[1]]).endswith("<|im_start|>user")


def test_shared_prefix_is_a_prefix_of_every_request_with_that_system_prompt(
    prompts: PromptBuilder,
) -> None:
    warm = prompts.shared_prefix([SYSTEM], TOOLS)
    for question in ["hi", "Hello there", "  leading spaces", "\nnewline first", "123"]:
        real = prompts.chat([SYSTEM, {"role": "user", "content": question}], TOOLS)
        assert real.tokens[: len(warm.tokens)] == warm.tokens
        assert len(warm.tokens) in real.cuts


def test_tools_reach_the_model_even_when_the_template_ignores_them(
    prompts: PromptBuilder,
) -> None:
    assert not prompts.template_handles_tools  # SmolLM2's template has no tools block
    text = prompts.decode(prompts.chat([SYSTEM, {"role": "user", "content": "x"}], TOOLS).tokens)
    assert '"name": "run_tests"' in text and text.index("run_tests") < text.index(
        "<|im_start|>user"
    )
    without_system = prompts.decode(prompts.chat([{"role": "user", "content": "x"}], TOOLS).tokens)
    assert without_system.startswith("<|im_start|>system\n# Tools")


def test_multi_turn_warm_prefix_covers_the_whole_history(prompts: PromptBuilder) -> None:
    history = [
        SYSTEM,
        {"role": "user", "content": "Example: #1"},
        {"role": "assistant", "content": "ok"},
    ]
    warm = prompts.shared_prefix(history)
    real = prompts.chat([*history, {"role": "user", "content": "Now #2"}])
    assert real.tokens[: len(warm.tokens)] == warm.tokens
    assert prompts.decode(warm.tokens).endswith("ok<|im_end|>\n<|im_start|>user")


def test_empty_and_bad_inputs_are_prompt_errors(prompts: PromptBuilder) -> None:
    with pytest.raises(PromptError):
        prompts.chat([])
    with pytest.raises(PromptError):
        prompts.completion("")
    assert prompts.completion([1, 2, 3]).tokens == (1, 2, 3)


def test_the_detokenizer_keeps_a_continuations_leading_space() -> None:
    """ "The sky is" + " blue" is " blue": mlx-lm's BPE detokenizer would give "blue"."""
    from warmfleet_daemon.models.loader import load_gguf_tokenizer_only

    tokenizer = load_gguf_tokenizer_only()
    ids = tokenizer.encode(" blue sky", add_special_tokens=False)
    detokenizer = tokenizer.detokenizer
    for token in ids:
        detokenizer.add_token(token)
    detokenizer.finalize()
    assert detokenizer.text == " blue sky"
