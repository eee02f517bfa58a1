"""A chat rendered and tokenized as the continuation of an earlier request of its
conversation: what `PromptBuilder.chat` gives, with the tokens and cuts that request
shares with the earlier one taken from it rather than computed again.

An agent's request is its previous request plus a turn, 10-30k tokens in all; keyed
whole, every turn tokenizes and hashes the whole conversation again. Nothing here is
assumed of the template or the request; each reuse is checked:

- the earlier request is used only when the new one starts with its exact messages
  (compared as JSON values: 1, 1.0 and true differ), with the same tools and template
  arguments; else the request is keyed whole;
- the new request is rendered whole (one render) and its text compared with the earlier
  one's: the tokens before the last added token that both texts read alike are reused
  (as TensorRT-LLM backs off at the split: BPE merges may cross it) and only the rest
  is tokenized, by the same piece encoder (`pieces`) the whole path uses;
- a message's content start is reused only for the same messages before it (and the same
  role), and each cut is checked against the new tokens as the whole path checks it.

Only for builders whose tokenizer has a piece encoder (`continuable`); the test compares
every field with `PromptBuilder.chat` on random conversations and edits.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
import threading
from array import array
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from warmfleet_common.pieces import shared_length
from warmfleet_common.probe_starts import Known, content_start, wide
from warmfleet_common.prompts import Message, PromptBuilder, PromptError, cut_candidates
from warmfleet_common.prompts import _keys_sorted as keys_sorted

_KEPT_HASHERS = 4  # running digests kept at the last cuts: where the next turn resumes
_HASHER_BYTES = 400  # a blake2b object, measured with sys.getsizeof and tracemalloc
_MESSAGE_BYTES = 400  # a message's dict and its strings' headers, besides its contents
# The sessions' tool lists, keys sorted, shared (a Claude Code list is ~300 KB of objects).
_SORTED_TOOLS: OrderedDict[bytes, list[Any]] = OrderedDict()
_SORTED_TOOLS_KEPT = 32
_SORTED_LOCK = threading.Lock()


@dataclass(frozen=True)
class ChatState:
    """What keying a chat leaves for the next request of its conversation."""

    messages: tuple[Message, ...]  # as given
    head: bytes  # digest of the tools and template arguments, as JSON
    text: str  # the rendered request
    tokens: array[int]  # its tokens ("I")
    marks: tuple[tuple[int, int], ...]  # its added tokens' ends (`PieceEncoder`)
    converted: tuple[Message, ...]  # after the tool conversions (`PromptBuilder._with_tools`)
    running: Any  # blake2b over the head and the converted messages (`_head_keys`)
    starts: Mapping[tuple[int, str], tuple[int, bytes] | None]  # content start by (index, role)
    digests: Mapping[int, bytes]  # digest of tokens[:count], at each cut looked at
    hashers: tuple[tuple[int, Any], ...]  # running digests at the last cuts

    @property
    def size_bytes(self) -> int:
        """What it holds, at least as tracemalloc counts it (the messages' contents
        counted as their rendered text, plus a dict and two strings' headers each)."""
        return (
            2 * sys.getsizeof(self.text)
            + 8 * len(self.converted)
            + 4 * len(self.tokens)
            + 120 * len(self.marks)
            + _MESSAGE_BYTES * len(self.messages)
            + 250 * (len(self.starts) + len(self.digests))
            + _HASHER_BYTES * (len(self.hashers) + 1)
        )


@dataclass(frozen=True)
class ChatTurn:
    """`PromptBuilder.chat`'s result (tokens as an array) and how much of it was reused."""

    tokens: array[int]
    cuts: tuple[int, ...]
    message_starts: tuple[int, ...]
    reply_start: int
    text: str
    reused: int  # leading tokens taken from the earlier request (0: keyed whole)


def continuable(builder: PromptBuilder) -> bool:
    """Whether `continue_chat` can key for this builder (its tokenizer's pieces are
    independent, so a text can be tokenized from an added token on)."""
    return builder.has_chat_template and builder._pieces is not None


def continue_chat(
    builder: PromptBuilder,
    messages: Sequence[Message],
    tools: Sequence[Mapping[str, Any]] | None,
    template_kwargs: Mapping[str, Any] | None,
    prior: ChatState | None,
) -> tuple[ChatTurn, ChatState]:
    """`builder.chat(messages, tools, template_kwargs=...)` (with the generation prompt),
    continuing `prior` where the checks above allow, and the state for the next turn."""
    pieces = builder._pieces
    if pieces is None:
        raise ValueError("this builder's tokenizer has no piece encoder")
    if not messages:
        raise PromptError("messages must not be empty")
    kwargs = dict(template_kwargs or {})
    head_json = json.dumps([tools, kwargs], sort_keys=True, default=str)
    head = hashlib.blake2b(head_json.encode("utf-8", "surrogatepass"), digest_size=16).digest()
    if prior is not None and not _extends(prior, messages, head):
        prior = None
    if prior is None:
        converted, converted_tools = builder._with_tools(messages, tools)
    else:  # a message's conversion is its own, but for the tools folded into the first
        appended, _ = builder._with_tools(messages[len(prior.messages) :], None)
        converted, converted_tools = [*prior.converted, *appended], _tools(builder, head, tools)
    added = len(converted) - len(messages)
    text = builder._render(converted, converted_tools, True, kwargs)
    begin, done = (0, 0)
    if prior is not None:
        begin, done = pieces.resume_point(prior.marks, shared_length(prior.text, text))
    _check_unicode(text[begin:])  # what came before was checked with the earlier text
    marks: list[tuple[int, int]] = []
    try:
        tail = pieces.encode_marked(text[begin:], marks)
    except (TypeError, ValueError) as exc:  # the tokenizers library's input errors
        raise PromptError(f"cannot tokenize this text: {exc}") from exc
    tokens = prior.tokens[:done] if prior is not None else array("I")
    tokens.extend(tail)
    kept_marks = prior.marks[: _marks_before(prior.marks, begin)] if prior is not None else ()
    all_marks = (*kept_marks, *((begin + c, done + n) for c, n in marks))

    count = len(converted)
    wanted = {i: converted[i].get("role") for i in cut_candidates(count)}
    wanted[count] = "assistant"  # where the reply starts
    roles = {i: json.dumps(role, default=str) for i, role in wanted.items()}
    resumable = [(c, h) for c, h in prior.hashers if c <= done] if prior is not None else []
    known = Known(text, tokens, all_marks, resumable)
    running, found_starts = _content_starts(
        builder, converted, converted_tools, kwargs, wanted, roles, prior, known
    )
    found = {i: s for i, s in found_starts.items() if s is not None and 0 < s[0] < len(tokens)}
    digests, hashers = _prefix_digests(tokens, sorted({c for c, _ in found.values()}), prior, done)
    kept = {i: cut for i, (cut, digest) in found.items() if digests[cut] == digest}
    starts = [kept.get(i, 0) for i in range(count)]
    reply = kept.get(count, 0)
    cuts = tuple(sorted({c for c in [*starts, reply] if c}))
    turn = ChatTurn(tokens, cuts, tuple(starts[added:]), reply, text, done)
    state = ChatState(
        tuple(messages),
        head,
        text,
        tokens,
        all_marks,
        tuple(converted),
        running,
        {(i, roles[i]): s for i, s in found_starts.items()},
        digests,
        hashers,
    )
    return turn, state


def _tools(
    builder: PromptBuilder, head: bytes, tools: Sequence[Mapping[str, Any]] | None
) -> Sequence[Mapping[str, Any]] | None:
    """The tools as `PromptBuilder._with_tools` gives them after the first message (keys
    sorted; None where the first message carries them), one copy per tool list."""
    if not tools:
        return tools
    if not builder.template_handles_tools:
        return None
    with _SORTED_LOCK:
        found = _SORTED_TOOLS.get(head)
        if found is not None:
            _SORTED_TOOLS.move_to_end(head)
            return found
    found = keys_sorted(tools)
    with _SORTED_LOCK:
        _SORTED_TOOLS[head] = found
        while len(_SORTED_TOOLS) > _SORTED_TOOLS_KEPT:
            _SORTED_TOOLS.popitem(last=False)
    return found


def _extends(prior: ChatState, messages: Sequence[Message], head: bytes) -> bool:
    """Whether `messages` start with the prior's, as JSON values, under the same head."""
    n = len(prior.messages)
    if head != prior.head or len(messages) < n:
        return False
    given = list(messages[:n])
    # `==` rejects most edits in C; the walk then tells 1, 1.0 and true apart.
    return given == list(prior.messages) and all(map(_same, given, prior.messages))


def _same(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if type(a) is str:
        return True  # already compared by `==`
    if isinstance(a, Mapping):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(map(_same, a, b))
    if type(a) is float:  # -0.0 == 0.0, and NaN is unequal to itself
        return bool(a == b and math.copysign(1.0, a) == math.copysign(1.0, b))
    return bool(a == b)


def _marks_before(marks: Sequence[tuple[int, int]], begin: int) -> int:
    """How many of `marks` end at or before character `begin`."""
    low, high = 0, len(marks)
    while low < high:
        middle = (low + high) // 2
        if marks[middle][0] <= begin:
            low = middle + 1
        else:
            high = middle
    return low


def _content_starts(
    builder: PromptBuilder,
    converted: Sequence[Message],
    tools: Sequence[Mapping[str, Any]] | None,
    kwargs: Mapping[str, Any],
    wanted: Mapping[int, Any],
    roles: Mapping[int, str],
    prior: ChatState | None,
    known: Known,
) -> tuple[Any, dict[int, tuple[int, bytes] | None]]:
    """Each wanted index's content start (`PromptBuilder._content_start`): the prior's
    where the messages before it are the prior's, else found with the memo key
    `_head_keys` gives (its running digest continued from the prior's messages); and
    the running digest over all the messages."""
    starts: Mapping[tuple[int, str], tuple[int, bytes] | None]
    if prior is not None:
        running, hashed = prior.running.copy(), len(prior.converted)
        starts, prior_end = prior.starts, hashed
    else:
        running, hashed = hashlib.blake2b(digest_size=16), 0
        starts, prior_end = {}, -1
        running.update(json.dumps([tools, dict(kwargs)], sort_keys=True, default=str).encode())
    reply_turn = [*converted, {"role": "assistant", "content": ""}]
    out: dict[int, tuple[int, bytes] | None] = {}
    for index in sorted(wanted):
        if index <= prior_end and (index, roles[index]) in starts:
            out[index] = starts[index, roles[index]]
            continue
        if index < hashed:  # before the prior's end, not looked at there: from the start
            key = _head_key(converted, index, roles[index], tools, kwargs)
        else:
            for message in converted[hashed:index]:
                running.update(b"\x01" + json.dumps(message, sort_keys=True, default=str).encode())
            hashed = index
            key = running.copy()
            key.update(b"\x00" + roles[index].encode())
        chat = reply_turn if index == len(converted) else converted
        out[index] = content_start(builder, chat, index, tools, kwargs, key.digest(), known)
    for message in converted[hashed:]:
        running.update(b"\x01" + json.dumps(message, sort_keys=True, default=str).encode())
    return running, out


def _head_key(
    converted: Sequence[Message],
    index: int,
    role: str,
    tools: Sequence[Mapping[str, Any]] | None,
    kwargs: Mapping[str, Any],
) -> Any:
    key = hashlib.blake2b(digest_size=16)
    key.update(json.dumps([tools, dict(kwargs)], sort_keys=True, default=str).encode())
    for message in converted[:index]:
        key.update(b"\x01" + json.dumps(message, sort_keys=True, default=str).encode())
    key.update(b"\x00" + role.encode())
    return key


def _prefix_digests(
    tokens: array[int], counts: Sequence[int], prior: ChatState | None, done: int
) -> tuple[dict[int, bytes], tuple[tuple[int, Any], ...]]:
    """The digest of tokens[:count] for each count (`prompts._prefix_digests`), the
    prior's where its first `done` tokens are these, else hashed on from the prior's last
    running digest at or before `done`; and the running digests at the last counts."""
    digests: dict[int, bytes] = {}
    hashers: list[tuple[int, Any]] = []
    running, at = hashlib.blake2b(digest_size=16), 0
    if prior is not None:
        resumable = [(c, h) for c, h in prior.hashers if c <= done]
        if resumable:
            at, start = resumable[-1]
            running = start.copy()
    for count in counts:
        if prior is not None and count <= done and count in prior.digests:
            digests[count] = prior.digests[count]
            continue
        if count < at:  # before where the prior's digests resume: from the start
            running, at = hashlib.blake2b(digest_size=16), 0
        running.update(wide(tokens[at:count]))
        at = count
        digests[count] = running.copy().digest()
        hashers.append((count, running.copy()))
    if prior is not None:  # the prior's running digests stay valid up to `done`
        earlier = [(c, h) for c, h in prior.hashers if c <= done]
        hashers = sorted([*earlier, *hashers], key=lambda pair: int(pair[0]))
    return digests, tuple(hashers[-_KEPT_HASHERS:])


def _check_unicode(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise PromptError("the text is not valid Unicode: a lone surrogate") from exc
