"""A chat template rendered without transformers' per-call work, for the router.

`PromptBuilder` renders a request's conversation a dozen times and more (probes that
find where each message's content starts); transformers' `apply_chat_template` spends
more than half of each call converting the messages to plain data, copying its special
tokens map and looking the template up. Messages parsed from JSON are plain data
already, so `FastRenderer` renders transformers' own compiled template (its sandbox,
filters and globals) with the same arguments, after the two conversions that change
what a template sees (keys whose value is None dropped; a message's reasoning under
every name templates read it by). It is built only when it renders exactly as
`apply_chat_template` on sample chats, and renders only lists of dicts; anything else
goes through transformers as before.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

log = logging.getLogger(__name__)

_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")  # transformers' order
_CALL = {"type": "function", "function": {"name": "run", "arguments": {"cmd": "ls -a"}}}
_TOOL = {
    "type": "function",
    "function": {
        "name": "run",
        "description": "Run a command",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
    },
}
_SAMPLES: tuple[tuple[list[dict[str, Any]], list[dict[str, Any]] | None, bool], ...] = (
    (
        [
            {"role": "system", "content": " You are terse. "},
            {"role": "user", "content": "Hi 42!\n", "name": None},
            {"role": "assistant", "content": "  Hello.", "reasoning_content": "greet"},
            {"role": "user", "content": "é\t漢"},
        ],
        None,
        True,
    ),
    (
        [
            {"role": "user", "content": "list files"},
            {"role": "assistant", "content": "", "tool_calls": [_CALL], "thinking": "use run"},
            {"role": "tool", "tool_call_id": "1", "content": "a b"},
            {"role": "assistant", "content": "x"},
        ],
        [_TOOL],
        False,
    ),
    ([{"role": "user", "content": "x"}, {"role": "assistant", "content": None}], None, False),
)


class FastRenderer:
    def __init__(self, hf_tokenizer: Any, defaults: Mapping[str, Any]) -> None:
        from transformers.utils.chat_template_utils import _compile_jinja_template

        template = getattr(hf_tokenizer, "chat_template", None)
        if not isinstance(template, str):
            raise ValueError("no single chat template")
        self._compiled = _compile_jinja_template(template)
        self._special = dict(hf_tokenizer.special_tokens_map)
        self._defaults = dict(defaults)

    @classmethod
    def checked(cls, hf_tokenizer: Any, defaults: Mapping[str, Any]) -> FastRenderer | None:
        """A renderer for `hf_tokenizer`'s template that renders the samples exactly as
        its `apply_chat_template` does (the same text, or the same error); else None."""
        try:
            renderer = cls(hf_tokenizer, defaults)
        except Exception as exc:  # a dict of templates, none, or another transformers
            log.info("chat template rendered through transformers: %s", exc)
            return None
        for messages, tools, generation in _SAMPLES:
            kwargs = {**defaults, "tools": tools, "add_generation_prompt": generation}
            try:
                expected: object = hf_tokenizer.apply_chat_template(
                    messages, tokenize=False, return_dict=False, **kwargs
                )
            except Exception as exc:
                expected = type(exc)
            try:
                found: object = renderer.render(messages, **kwargs)
            except Exception as exc:
                found = type(exc)
            if found != expected:
                log.info("chat template rendered through transformers: a sample differs")
                return None
        return renderer

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = False,
        **kwargs: Any,
    ) -> str:
        chat = []
        for message in messages:
            plain = {k: v for k, v in message.items() if v is not None}
            reasoning = next((plain[k] for k in _REASONING_FIELDS if k in plain), None)
            if reasoning is not None:
                plain = {"thinking": reasoning, **plain, "reasoning_content": reasoning}
            chat.append(plain)
        return str(
            self._compiled.render(
                messages=chat,
                tools=list(tools) if tools is not None else None,
                documents=None,
                add_generation_prompt=add_generation_prompt,
                **{**self._special, **self._defaults, **kwargs},
            )
        )


def plain_messages(messages: Any) -> bool:
    """Messages `FastRenderer` renders as transformers would: a list of dicts."""
    return isinstance(messages, list) and all(type(m) is dict for m in messages)
