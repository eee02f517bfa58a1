"""Chat template rendering and tokenization: the one path every prompt takes.

Requests, warm-up and the benchmarks all go through `PromptBuilder`, so a warmed
prefix is tokenized exactly like the requests that reuse it. Besides the tokens it
finds the *cuts*: for each message, how many tokens come before its content that no
content can change. They are found by rendering the conversation up to that message
with contents that differ from the first character (letters, spaces, newlines, digits,
punctuation) and keeping the tokens all renderings share: cutting at the first
differing character is not enough, since a content that starts with a space or a
newline merges with the template's trailing newline into another token. The chunk
planner puts a chunk boundary at every cut, which is what lets a warmed system prompt
(and tool list) be reused in full by every request that shares it.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from jinja2 import TemplateError

from warmfleet_common.pieces import PieceEncoder, shared_length
from warmfleet_common.role_rules import RoleRules
from warmfleet_common.verbatim import PROBES as _PROBES
from warmfleet_common.verbatim import SAMPLE_TOOLS, inserts_verbatim, probe_texts

Message = Mapping[str, Any]

_MEMO_SIZE = 4096
# Cuts are looked for at the first messages and the last one: each costs a render of
# the conversation up to it, so every message would make a long chat quadratic. The
# rule depends on the message count only (chunking stays deterministic), and a next
# turn still reuses the previous one's blocks up to its last block before that cut.
_CUT_HEAD_MESSAGES = 64
# ... and at the last few: the previous turn of an agent's conversation (its prompt ended
# where the assistant message it got back starts) is then a cut of the next turn.
_CUT_TAIL_MESSAGES = 3

# For chat templates that ignore `tools` (the embedded SmolLM2's does): the Hermes/Qwen
# convention, appended to the system message so the model sees the tool list.
_TOOLS_PREAMBLE = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
)
_TOOLS_POSTAMBLE = (
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)


class PromptError(ValueError):
    """The messages cannot be rendered (template error, bad structure)."""


class PromptTooLong(PromptError):
    def __init__(self, tokens: int) -> None:
        super().__init__(f"the prompt has {tokens} tokens")
        self.tokens = tokens


class PromptCancelled(PromptError):
    """The caller no longer wants the prompt (its client went away)."""


@dataclass(frozen=True)
class RenderedPrompt:
    tokens: tuple[int, ...]
    cuts: tuple[int, ...] = ()  # token positions where a message's content starts
    text: str | None = None
    # Per message of the request: the cut where its content starts (0: none found).
    message_starts: tuple[int, ...] = ()
    # Where the reply's content starts: the next turn's assistant message starts there
    # (a cut of both, so the next turn reuses this whole prompt but the reply's header).
    reply_start: int = 0
    # The cache namespace its blocks are keyed in (`tenancy.cache_salt`; b"": shared).
    salt: bytes = b""

    @property
    def content_start(self) -> int:
        """Where the last message's content starts (0: unknown): what comes before it is
        the prompt's static part."""
        return max((c for c in self.cuts if c != self.reply_start), default=0)


class PromptBuilder:
    """Renders chats with the model's template and tokenizes them with its tokenizer."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer  # an mlx-lm TokenizerWrapper
        template = getattr(tokenizer, "chat_template", None)
        self.has_chat_template = bool(template)
        self.template_handles_tools = bool(template) and "tools" in str(template)
        self.reasoning_field = reasoning_field(str(template or ""))
        # What the template refuses of the agents' layouts (mid-conversation system
        # messages, user messages in a row, long tool call ids), probed once: every
        # render then folds such messages in place (`role_rules`), turn after turn alike.
        self.role_rules = RoleRules()
        if self.has_chat_template:
            self.role_rules = RoleRules.probe(
                lambda messages, tools: self._render(messages, tools, True, {})
            )
        self._content_starts: OrderedDict[bytes, tuple[int, bytes] | None] = OrderedDict()
        self._memo_lock = threading.Lock()  # prompts are built on several threads
        # Every probe rendering repeats the conversation before the probe: its pieces
        # are tokenized once (a 20k-token agent request: 49 whole-text encodes, ~7 s).
        self._pieces = PieceEncoder.of(tokenizer, self._sample_chats())
        # Whether a message's probes render from one render (`verbatim`), per tools given
        # and template arguments.
        self._verbatim: dict[tuple[bool, str], bool] = {}

    # -- public API -------------------------------------------------------------

    def chat(
        self,
        messages: Sequence[Message],
        tools: Sequence[Mapping[str, Any]] | None = None,
        *,
        add_generation_prompt: bool = True,
        max_tokens: int | None = None,
        cancelled: Callable[[], bool] | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> RenderedPrompt:
        """Render and tokenize a chat request, with a cut where each message's content
        starts (`cut_candidates`). Raises PromptTooLong with `max_tokens` tokens or
        more, and PromptCancelled once `cancelled()` is true. Linear in the messages.
        `template_kwargs` go to the template (e.g. `enable_thinking`)."""
        if not messages:
            raise PromptError("messages must not be empty")
        given = len(messages)
        messages, tools = self._with_tools(messages, tools)
        added = len(messages) - given  # a system message that carries the tool list
        kwargs = dict(template_kwargs or {})
        text = self._render(messages, tools, add_generation_prompt, kwargs)
        tokens = self._encode(text, add_special_tokens=False)
        if max_tokens is not None and len(tokens) >= max_tokens:
            raise PromptTooLong(len(tokens))  # before any cut is looked for
        candidates = cut_candidates(len(messages))
        roles = {i: messages[i].get("role") for i in candidates}
        if add_generation_prompt:
            roles[len(messages)] = "assistant"  # where the reply starts
        keys = _head_keys(messages, roles, tools, kwargs)
        found: dict[int, tuple[int, bytes]] = {}
        for index in candidates:
            if cancelled is not None and cancelled():
                raise PromptCancelled("the client went away")
            start = self._content_start(messages, index, tools, kwargs, keys[index])
            if start is not None and 0 < start[0] < len(tokens):
                found[index] = start
        if add_generation_prompt:
            reply_turn = [*messages, {"role": "assistant", "content": ""}]
            index = len(messages)
            start = self._content_start(reply_turn, index, tools, kwargs, keys[index])
            if start is not None and 0 < start[0] < len(tokens):
                found[index] = start
        # The prompt's own head at each cut, hashed in one pass over its tokens; a cut is
        # kept only if the template renders what precedes it the same once more follows.
        heads = _prefix_digests(array("q", tokens).tobytes(), [c for c, _ in found.values()])
        kept = {i: cut for i, (cut, digest) in found.items() if heads[cut] == digest}
        starts = [kept.get(i, 0) for i in range(len(messages))]
        reply = kept.get(len(messages), 0)
        cuts = tuple(sorted({c for c in [*starts, reply] if c}))
        return RenderedPrompt(tuple(tokens), cuts, text, tuple(starts[added:]), reply)

    def completion(self, prompt: str | Sequence[int]) -> RenderedPrompt:
        if isinstance(prompt, str):
            if not prompt:
                raise PromptError("prompt must not be empty")
            return RenderedPrompt(tuple(self._encode(prompt)), (), prompt)
        if not prompt:
            raise PromptError("prompt must not be empty")
        return RenderedPrompt(tuple(int(t) for t in prompt))

    def shared_prefix(
        self,
        messages: Sequence[Message],
        tools: Sequence[Mapping[str, Any]] | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> RenderedPrompt:
        """The strict prefix shared by every request that continues `messages` with one
        more user message: what warm-up prefills. Its end is a cut in those requests."""
        probe = [*messages, {"role": "user", "content": _PROBES[0]}]
        rendered = self.chat(probe, tools, template_kwargs=template_kwargs)
        last_cut = rendered.message_starts[-1] if rendered.message_starts else 0
        if not last_cut:
            raise PromptError("the chat template gives no stable prefix for these messages")
        cuts = tuple(c for c in rendered.cuts if c < last_cut)
        return RenderedPrompt(rendered.tokens[:last_cut], cuts, None)

    def next_turn(
        self,
        messages: Sequence[Message],
        tools: Sequence[Mapping[str, Any]] | None = None,
        *,
        tool_call_ids: Sequence[str] = (),
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> list[RenderedPrompt]:
        """The strict prefixes the next request of a conversation starts with, once
        `messages` ends with the assistant's answer as the client will send it back:
        rendered with the next message(s) as probes, cut where the first one's content
        starts, with the cuts that request will have (the same message count, so the
        same chunk plan). The next message is a user message, or after tool calls one
        tool result per call (`tool_call_ids`); when both may follow and they part
        before their contents start, both prefixes (they share every block before)."""
        variants: list[list[Message]] = [[{"role": "user", "content": _PROBES[0]}]]
        if tool_call_ids:
            tool: list[Message] = [
                {"role": "tool", "tool_call_id": i, "content": _PROBES[0]} for i in tool_call_ids
            ]
            variants.insert(0, tool)  # what an agent sends after its tool calls
        out: list[RenderedPrompt] = []
        for probe in variants:
            conversation = [*messages, *probe]
            rendered = self.chat(conversation, tools, template_kwargs=template_kwargs)
            end = self._probe_start(conversation, len(messages), tools, template_kwargs, rendered)
            if not end:
                continue
            prefix = RenderedPrompt(
                rendered.tokens[:end], tuple(c for c in rendered.cuts if c < end), None
            )
            if prefix not in out:
                out.append(prefix)
        if not out:
            raise PromptError("the chat template gives no stable prefix for the next turn")
        return out

    def _probe_start(
        self,
        conversation: Sequence[Message],
        index: int,
        tools: Sequence[Mapping[str, Any]] | None,
        template_kwargs: Mapping[str, Any] | None,
        rendered: RenderedPrompt,
    ) -> int:
        """Where message `index` (the first probe) starts in `rendered`: its cut, or
        where no cut is looked for (past the first messages, not among the last), the
        tokens every content shares there (the next request's blocks before it match)."""
        given = rendered.message_starts[index] if index < len(rendered.message_starts) else 0
        if given:
            return given
        converted, tools = self._with_tools(conversation, tools)
        shift = len(converted) - len(conversation)
        found = self._content_start(converted, index + shift, tools, dict(template_kwargs or {}))
        if found is None or not 0 < found[0] < len(rendered.tokens):
            return 0
        return found[0] if _digest(rendered.tokens[: found[0]]) == found[1] else 0

    def decode(self, tokens: Sequence[int]) -> str:
        return str(self._tokenizer.decode(list(tokens)))

    # -- helpers ----------------------------------------------------------------

    def _encode(self, text: str, **kwargs: Any) -> list[int]:
        _check_unicode(text)
        try:
            if self._pieces is not None and kwargs.get("add_special_tokens") is False:
                return self._pieces.encode(text)
            return list(self._tokenizer.encode(text, **kwargs))
        except (TypeError, ValueError) as exc:  # the tokenizers library's input errors
            raise PromptError(f"cannot tokenize this text: {exc}") from exc

    def _inserts_verbatim(
        self, tools: Sequence[Mapping[str, Any]] | None, template_kwargs: Mapping[str, Any]
    ) -> bool:
        key = (bool(tools), json.dumps(template_kwargs, sort_keys=True, default=str))
        found = self._verbatim.get(key)
        if found is None:
            sample = list(SAMPLE_TOOLS) if tools else None
            found = self._verbatim[key] = inserts_verbatim(
                lambda m: self._render(m, sample, False, template_kwargs)
            )
        return found

    def _sample_chats(self) -> list[str]:
        """A chat rendered by the template: what the piece memo is checked on."""
        if not self.has_chat_template:
            return []
        try:
            return [
                self._render(
                    [
                        {"role": "system", "content": " You are terse. "},
                        {"role": "user", "content": "Hi 42!\n"},
                        {"role": "assistant", "content": "  Hello."},
                        {"role": "user", "content": "é\t漢"},
                    ],
                    None,
                    True,
                    {},
                )
            ]
        except PromptError:  # a template that wants other roles: the rest still check
            return []

    def _render(
        self,
        messages: Sequence[Message],
        tools: Sequence[Mapping[str, Any]] | None,
        add_generation_prompt: bool,
        template_kwargs: Mapping[str, Any],
    ) -> str:
        if not self.has_chat_template:
            raise PromptError("this model has no chat template; use /v1/completions")
        if self.role_rules.strict:
            messages = self.role_rules.apply(messages)
        try:
            text = self._tokenizer.apply_chat_template(
                list(messages),
                tools=list(tools) if tools else None,
                add_generation_prompt=add_generation_prompt,
                tokenize=False,
                **template_kwargs,
            )
        except TemplateError as exc:
            raise PromptError(f"chat template error: {exc}") from exc
        except (TypeError, KeyError, ValueError) as exc:
            raise PromptError(f"cannot render these messages: {exc}") from exc
        return str(text)

    def _with_tools(
        self, messages: Sequence[Message], tools: Sequence[Mapping[str, Any]] | None
    ) -> tuple[Sequence[Message], Sequence[Mapping[str, Any]] | None]:
        messages = tool_history(messages, self.template_handles_tools)
        if self.reasoning_field == "thinking":
            messages = [_with_thinking(m) for m in messages]
        # Keys sorted: a tool list read back from Kubernetes (a WarmPromptSet: the API
        # server sorts object keys) renders exactly as the client's own order does.
        tools = _keys_sorted(tools) if tools else tools
        if not tools or self.template_handles_tools:
            return messages, tools
        block = _TOOLS_PREAMBLE + "\n".join(json.dumps(t) for t in tools) + _TOOLS_POSTAMBLE
        if messages[0].get("role") == "system":
            system = {**messages[0], "content": f"{messages[0].get('content') or ''}\n\n{block}"}
            return [system, *messages[1:]], None
        return [{"role": "system", "content": block}, *messages], None

    def _content_start(
        self,
        messages: Sequence[Message],
        index: int,
        tools: Sequence[Mapping[str, Any]] | None,
        template_kwargs: Mapping[str, Any],
        key: bytes | None = None,
    ) -> tuple[int, bytes] | None:
        """Tokens before messages[index]'s content that no content can change, and their
        digest; None when the template gives no stable cut there. Memoized (`key`:
        `_head_keys`'): system prompts repeat."""
        head = list(messages[:index])
        role = messages[index].get("role")
        if key is None:
            key = _head_keys(messages, {index: role}, tools, template_kwargs)[index]
        with self._memo_lock:
            if key in self._content_starts:
                self._content_starts.move_to_end(key)
                return self._content_starts[key]
        cut: tuple[int, bytes] | None = None
        try:
            texts = None
            if self._inserts_verbatim(tools, template_kwargs):
                texts = probe_texts(
                    lambda m: self._render(m, tools, False, template_kwargs), head, role
                )
            if texts is None:
                chats = [[*head, {"role": role, "content": p}] for p in _PROBES]
                texts = [self._render(m, tools, False, template_kwargs) for m in chats]
            if self._pieces is not None:  # the shared head tokenized once, not per probe
                for text in texts:
                    _check_unicode(text)
                try:
                    common, shared = self._pieces.common_prefix(texts)
                except (TypeError, ValueError) as exc:  # the tokenizers library's input errors
                    raise PromptError(f"cannot tokenize this text: {exc}") from exc
            else:
                probes = [self._encode(t, add_special_tokens=False) for t in texts]
                common = _common_prefix(probes)
                shared = probes[0][:common]
            cut = (common, _digest(shared)) if common else None
        except PromptError:
            cut = None  # e.g. templates that insist on alternating roles
        with self._memo_lock:
            self._content_starts[key] = cut
            if len(self._content_starts) > _MEMO_SIZE:
                self._content_starts.popitem(last=False)
        return cut


_READS_THINKING = re.compile(
    r"""message\.thinking|message\[['"]thinking['"]\]|['"]thinking['"] in message"""
)


def reasoning_field(template: str) -> str:
    """The assistant-message field a chat template reads passed-back reasoning from:
    `thinking` for gpt-oss's, `reasoning_content` (vLLM's name) for Qwen3's,
    DeepSeek-R1's and most others."""
    if "reasoning_content" not in template and _READS_THINKING.search(template):
        return "thinking"
    return "reasoning_content"


def _with_thinking(message: Message) -> Message:
    """An assistant message as gpt-oss's template takes it: the reasoning in `thinking`,
    a string content, no empty `tool_calls` (it tests the key, then reads the first
    call), and with a call, one of content or thinking (it raises on both: its analysis
    message is one or the other; they are joined, so nothing is lost)."""
    if message.get("role") != "assistant":
        return message
    out = {k: v for k, v in message.items() if k != "reasoning_content"}
    if "tool_calls" in out and not out["tool_calls"]:
        del out["tool_calls"]
    content = out.get("content") or ""
    out["content"] = content
    thinking = message.get("reasoning_content")
    if thinking:
        out["thinking"] = thinking
        if out.get("tool_calls") and content:
            out["thinking"], out["content"] = f"{thinking}\n\n{content}", ""
    return out


def _keys_sorted(tools: Sequence[Mapping[str, Any]]) -> list[Any]:
    """`tools` with every object's keys sorted: through json's C encoder and decoder (a
    walk in Python took 5 ms per request for Claude Code's tool list)."""
    try:
        return list(json.loads(json.dumps(list(tools), sort_keys=True)))
    except (TypeError, ValueError):  # not plain JSON (a caller's own objects)
        return [_sorted_keys(t) for t in tools]


def _head_keys(
    messages: Sequence[Message],
    wanted: Mapping[int, Any],
    tools: Sequence[Mapping[str, Any]] | None,
    template_kwargs: Mapping[str, Any],
) -> dict[int, bytes]:
    """The content-start memo key of each wanted index (with the role its message has
    there): a digest of the messages before it, that role, the tools and the template's
    arguments. Each message is serialized once, however many candidates follow it."""
    running = hashlib.blake2b(digest_size=16)
    running.update(json.dumps([tools, template_kwargs], sort_keys=True, default=str).encode())
    keys: dict[int, bytes] = {}
    for i in range(max(wanted, default=-1) + 1):
        if i in wanted:
            key = running.copy()
            key.update(b"\x00" + json.dumps(wanted[i], default=str).encode())
            keys[i] = key.digest()
        if i < len(messages):  # NUL and SOH never occur raw in JSON: unambiguous
            running.update(b"\x01" + json.dumps(messages[i], sort_keys=True, default=str).encode())
    return keys


def _prefix_digests(packed: bytes, counts: Sequence[int]) -> dict[int, bytes]:
    """_digest(tokens[:count]) for each count, from `array("q", tokens).tobytes()`: one
    pass, each digest a copy of the running hash (not one hash per prefix)."""
    running = hashlib.blake2b(digest_size=16)
    view, done, out = memoryview(packed), 0, {}
    for count in sorted(set(counts)):
        running.update(view[8 * done : 8 * count])
        done = count
        out[count] = running.copy().digest()
    return out


def _sorted_keys(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _sorted_keys(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_sorted_keys(v) for v in value]
    return value


def cut_candidates(count: int) -> list[int]:
    """Indices of the messages whose content start becomes a cut."""
    head = list(range(min(count, _CUT_HEAD_MESSAGES)))
    tail = range(max(count - _CUT_TAIL_MESSAGES, _CUT_HEAD_MESSAGES), count)
    return [*head, *tail]


def _check_unicode(text: str) -> None:
    """Lone surrogates (JSON's "\\ud800") are valid in a Python str but not in UTF-8,
    which is what the tokenizer needs."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise PromptError(
            f"the text is not valid Unicode: a lone surrogate ({text[exc.start]!r}) at "
            f"character {exc.start}"
        ) from exc


def _digest(tokens: Sequence[int]) -> bytes:
    return hashlib.blake2b(_packed(tokens), digest_size=16).digest()


def _packed(tokens: Sequence[int]) -> bytes:
    """Token ids as fixed-width bytes: compared and hashed in C, not per int in Python."""
    try:
        return array("q", tokens).tobytes()
    except OverflowError:  # ids past 2**63 (only from a hostile prompt): still exact
        return json.dumps(list(tokens)).encode()


def _common_prefix(sequences: Sequence[Sequence[int]]) -> int:
    """Tokens every sequence starts with: the common prefix of their packed ids (8 bytes
    per token), compared in C rather than one token at a time in Python."""
    packed = [array("q", s).tobytes() for s in sequences]
    return shared_length(min(packed), max(packed)) // 8


def tool_history(messages: Sequence[Message], template_handles_tools: bool) -> list[Message]:
    """Assistant tool calls and tool results, ready for the template: arguments as
    objects (what templates with tool support expect, as in mlx-lm's server); for
    templates without, the Hermes convention the tools preamble announces (calls in
    <tool_call> tags, results in a user turn in <tool_response> tags)."""
    out: list[Message] = []
    for message in messages:
        calls = message.get("tool_calls")
        if calls:
            calls = [_call_with_object_arguments(c) for c in calls]
            if template_handles_tools:
                message = {**message, "tool_calls": calls}
            else:
                text = "\n".join(
                    "<tool_call>\n"
                    + json.dumps(
                        {
                            "name": (c.get("function") or {}).get("name"),
                            "arguments": (c.get("function") or {}).get("arguments"),
                        },
                        ensure_ascii=False,
                    )
                    + "\n</tool_call>"
                    for c in calls
                )
                content = message.get("content") or ""
                message = {k: v for k, v in message.items() if k != "tool_calls"} | {
                    "content": f"{content}\n{text}" if content else text
                }
        elif message.get("role") == "tool" and not template_handles_tools:
            message = {
                "role": "user",
                "content": f"<tool_response>\n{message.get('content') or ''}\n</tool_response>",
            }
        out.append(message)
    return out


def _call_with_object_arguments(call: Any) -> Any:
    function = call.get("function") if isinstance(call, Mapping) else None
    arguments = function.get("arguments") if isinstance(function, Mapping) else None
    if not isinstance(arguments, str):
        return call
    try:
        parsed = json.loads(arguments)
    except ValueError as exc:
        raise PromptError(f"tool call arguments are not valid JSON: {exc}") from exc
    return {**call, "function": {**function, "arguments": parsed}}  # type: ignore[dict-item]
