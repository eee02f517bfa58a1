"""A tokenizer with a thinking switch, as Qwen3's: the embedded tokenizer plus `<think>`
and `</think>` tokens and a ChatML template that renders `reasoning_content` and closes
the thinking itself when `enable_thinking` is false. With it, a tiny random model or
the scripted model is a "reasoning model" for the API tests."""

from __future__ import annotations

import copy
from typing import Any

from mlx_lm.tokenizer_utils import TokenizerWrapper

from support.engine import model
from warmfleet_daemon.models.gguf import ContinuingBPEDetokenizer

TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n# Tools\n{%- for tool in tools %}\n{{ tool | tojson }}"
    '{%- endfor %}\nCall them as <tool_call>{"name": ..., "arguments": ...}</tool_call>'
    "<|im_end|>\n{%- endif %}"
    "{%- for message in messages %}"
    "{{ '<|im_start|>' + message.role + '\n' }}"
    "{%- if message.role == 'assistant' and message.reasoning_content %}"
    "{{ '<think>\n' + message.reasoning_content + '\n</think>\n\n' }}{%- endif %}"
    "{{ message.content }}"
    "{%- for call in message.tool_calls or [] %}"
    "{{ '<tool_call>\n' + {'name': call.function.name, 'arguments': call.function.arguments}"
    " | tojson + '\n</tool_call>' }}{%- endfor %}"
    "{{ '<|im_end|>\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{ '<think>\n\n</think>\n\n' }}{%- endif %}{%- endif %}"
)


def thinking_tokenizer() -> Any:
    base = model("tiny-random").tokenizer
    hf = copy.deepcopy(base._tokenizer)
    hf.add_tokens(["<think>", "</think>"])
    hf.chat_template = TEMPLATE
    wrapper = TokenizerWrapper(hf, detokenizer_class=ContinuingBPEDetokenizer)
    assert wrapper.has_thinking
    return wrapper
