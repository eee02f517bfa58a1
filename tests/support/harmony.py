"""A tokenizer that speaks harmony, as gpt-oss's: the embedded tokenizer plus harmony's
special tokens (`<|start|>`, `<|channel|>`, `<|message|>`, `<|end|>`, `<|return|>`,
`<|call|>`, `<|constrain|>`; `<|return|>` and `<|call|>` are its EOS) and a template
written to render as gpt-oss's does: the system message with `Reasoning: <effort>`,
the developer message (instructions and the `functions` namespace), assistant answers
on the `final` channel, a call as `<|start|>assistant to=functions.NAME<|channel|>
commentary json<|message|>ARGS<|call|>` after its `analysis` message (the message's
`thinking`, or its content; both is an error, as there; dropped once a final answer
follows), tool results from `functions.NAME to=assistant`, and `<|start|>assistant` as
the generation prompt. With it, the scripted model is a gpt-oss for the API tests."""

from __future__ import annotations

import copy
from typing import Any

from mlx_lm.tokenizer_utils import TokenizerWrapper

from support.engine import model
from warmfleet_daemon.models.gguf import ContinuingBPEDetokenizer

SPECIAL = ["<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>"]
SPECIAL += ["<|constrain|>"]
GENERATION_PROMPT = "<|start|>assistant"
# Where a reply starts: after the last user message or tool result (the model's own
# output starts messages with <|start|>assistant too).
TURNS_AFTER = ("<|start|>user", "<|start|>functions")

TEMPLATE = (
    "<|start|>system<|message|>You are a tiny harmony model.\n"
    "Reasoning: {{ reasoning_effort if reasoning_effort is defined else 'medium' }}\n\n"
    "# Valid channels: analysis, commentary, final. Channel must be included for every "
    "message.{% if tools %}\nCalls to these tools must go to the commentary channel: "
    "'functions'.{% endif %}<|end|>"
    "{%- if messages[0].role in ('system', 'developer') %}"
    "{%- set developer = messages[0].content %}{%- set rest = messages[1:] %}"
    "{%- else %}{%- set developer = '' %}{%- set rest = messages %}{%- endif %}"
    "{%- if developer or tools %}<|start|>developer<|message|>"
    "{%- if developer %}# Instructions\n\n{{ developer }}\n\n{% endif %}"
    "{%- if tools %}# Tools\n\n## functions\n\nnamespace functions {\n\n"
    "{%- for tool in tools %}// {{ tool.function.description }}\ntype "
    "{{ tool.function.name }} = (_: {{ tool.function.parameters | tojson }}) => any;\n\n"
    "{%- endfor %}} // namespace functions{% endif %}<|end|>{%- endif %}"
    "{%- set last = namespace(name=none) %}"
    "{%- for message in rest %}"
    "{%- if message.role == 'assistant' and 'tool_calls' in message %}"
    "{%- set future = namespace(final=false) %}"
    "{%- for later in rest[loop.index:] %}"
    "{%- if later.role == 'assistant' and 'tool_calls' not in later %}"
    "{%- set future.final = true %}{%- endif %}{%- endfor %}"
    "{%- set call = message.tool_calls[0].function %}"
    "{%- if message.content and message.thinking %}"
    "{{ raise_exception('Cannot pass both content and thinking in an assistant message "
    "with tool calls!') }}"
    "{%- elif message.content and not future.final %}"
    "<|start|>assistant<|channel|>analysis<|message|>{{ message.content }}<|end|>"
    "{%- elif message.thinking and not future.final %}"
    "<|start|>assistant<|channel|>analysis<|message|>{{ message.thinking }}<|end|>"
    "{%- endif %}"
    "<|start|>assistant to=functions.{{ call.name }}<|channel|>commentary json<|message|>"
    "{{ call.arguments | tojson }}<|call|>{%- set last.name = call.name %}"
    "{%- elif message.role == 'assistant' %}"
    "<|start|>assistant<|channel|>final<|message|>{{ message.content }}<|end|>"
    "{%- elif message.role == 'tool' %}<|start|>functions.{{ last.name }} to=assistant"
    "<|channel|>commentary<|message|>{{ message.content | tojson }}<|end|>"
    "{%- else %}<|start|>{{ message.role }}<|message|>{{ message.content }}<|end|>"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<|start|>assistant{% endif %}"
)


def harmony_tokenizer() -> Any:
    base = model("tiny-random").tokenizer
    hf = copy.deepcopy(base._tokenizer)
    hf.add_special_tokens({"additional_special_tokens": SPECIAL})
    hf.chat_template = TEMPLATE
    eos = [hf.convert_tokens_to_ids("<|return|>"), hf.convert_tokens_to_ids("<|call|>")]
    return TokenizerWrapper(hf, detokenizer_class=ContinuingBPEDetokenizer, eos_token_ids=eos)
