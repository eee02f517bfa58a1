"""Everything the router does with a request body before routing it, as one job a
worker process runs (so none of it runs on the router's event loop): parse it, check
what the daemons would refuse and the router cannot key (JSON nesting, token ids,
a prompt longer than every backend's context), read its model and session fields, and
key its prompt for each layout asked for. Plain Python, no I/O but reading layout files
the router writes (`KeyerCache`).

A prompt is refused by size before it is tokenized: no tokenizer makes fewer than
bytes / (its longest token's bytes) tokens of a text, so a text whose bound already
exceeds every backend's context is refused with the daemons' `context_length_exceeded`.
Invalids the daemons give after checking the model (token ids, context) are deferred:
the router answers them only once the model is known to be served.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from warmfleet_common.cache_layout import CacheLayout
from warmfleet_common.prompts import PromptError
from warmfleet_common.tenancy import cache_salt, cache_salt_problem
from warmfleet_router.keys import (
    EMPTY,
    MESSAGE_KEYS,
    ChatPrompt,
    Keyer,
    LayoutKeyer,
    MessageKeyer,
    Prompt,
    RequestBlocks,
    Salt,
    TextPrompt,
)
from warmfleet_router.learning import Head, head_of
from warmfleet_router.routes import BY_NAME
from warmfleet_router.sessions import body_values, capped
from warmfleet_router.turn_memo import TurnMemo

log = logging.getLogger(__name__)

TOKEN_ID_LIMIT = 2**32  # block keys pack token ids as unsigned 32-bit integers
_HEAD_MESSAGES = 4  # a session without a key is named by at most its first messages


@dataclass(frozen=True)
class Invalid:
    """What a daemon would refuse the request for (its 400), and the router answers."""

    message: str
    param: str | None = None
    code: str | None = None


class RequestInvalid(Exception):
    def __init__(self, invalid: Invalid) -> None:
        super().__init__(invalid.message)
        self.invalid = invalid


@dataclass(frozen=True)
class Job:
    route: str
    raw: bytes
    fingerprints: tuple[str, ...] = ()  # layouts to key the prompt for (and "messages")
    session_paths: tuple[tuple[str, ...], ...] = ()  # body fields that hold session keys
    max_context: int | None = None  # the largest context of the ready backends, if known
    tenant: str | None = None  # the client key's tenant: its blocks are keyed with its salt
    shared_tokens: int = 0  # the longest fleet-wide warm prompt (`keys.Salt`)
    learn: bool = False  # read the request's static head (`learning.head_of`)
    session: str | None = None  # a session key from the headers (`turn_memo`)


@dataclass(frozen=True)
class Prepared:
    parsed: bool  # the body is a JSON object (else the backend answers it)
    model: str | None = None
    session_values: tuple[str | None, ...] = ()
    blocks: dict[str, RequestBlocks] = field(default_factory=dict)
    invalid: Invalid | None = None  # after the model check
    cpu_seconds: float = 0.0
    head: Head | None = None  # its static head, when the job asked (`Job.learn`)


class KeyerCache:
    """The keyers of the layouts the router has written to `directory` (one
    `<fingerprint>.json` each), built on first use."""

    def __init__(self, directory: Path | None) -> None:
        self._directory = directory
        self._keyers: dict[str, Keyer | None] = {MESSAGE_KEYS: MessageKeyer()}
        self.turns = TurnMemo()  # this process's sessions' last requests, keyed

    def get(self, fingerprint: str) -> Keyer | None:
        if fingerprint not in self._keyers:
            self._keyers[fingerprint] = self._load(fingerprint)
        return self._keyers[fingerprint]

    def add(self, layout: CacheLayout) -> Keyer | None:
        """Build the keyer of a layout in hand (None: not usable here, and why is logged)."""
        try:
            keyer: Keyer | None = LayoutKeyer(layout)
        except (ValueError, OSError) as exc:
            log.warning("layout of %s not usable (%s): message keys instead", layout.model, exc)
            keyer = None
        self._keyers[layout.fingerprint] = keyer
        return keyer

    def _load(self, fingerprint: str) -> Keyer | None:
        if self._directory is None or not fingerprint.isalnum():
            return None
        try:
            text = (self._directory / f"{fingerprint}.json").read_bytes()
            return self.add(CacheLayout.model_validate_json(text))
        except (OSError, ValidationError) as exc:
            log.warning("layout %s unreadable: %s", fingerprint, exc)
            return None


def prepare(job: Job, keyers: KeyerCache) -> Prepared | Invalid:
    """Run one job; an Invalid is answered at once (before the model is looked at)."""
    started = time.thread_time()  # this job's own CPU, on a worker or a router thread
    result = _prepare(job, keyers)
    if isinstance(result, Prepared):
        return dataclasses.replace(result, cpu_seconds=time.thread_time() - started)
    return result


def _prepare(job: Job, keyers: KeyerCache) -> Prepared | Invalid:
    try:
        body = json.loads(job.raw)
    except RecursionError:  # as FastAPI answers it on the daemons
        return Invalid("There was an error parsing the body")
    except ValueError:
        return Prepared(False)  # not JSON: the backend answers it with its own 400
    if not isinstance(body, dict):
        return Prepared(False)
    model = body.get("model")
    sessions = body_values(body, job.session_paths)
    route = BY_NAME[job.route]
    wanted = [k for k in (keyers.get(f) for f in job.fingerprints) if k is not None]
    try:
        prompt = route.prompt_of(body)
    except (KeyError, TypeError, ValueError, ValidationError, RecursionError):
        prompt = None  # the backend answers it with its own 400
    invalid = _invalid(prompt, wanted, job.max_context)
    blocks: dict[str, RequestBlocks] = {}
    own = body.get("cache_salt")
    if cache_salt_problem(own) is not None:
        prompt = None  # the backend answers it with its own 400
    if invalid is None and prompt is not None:
        salt = Salt(cache_salt(job.tenant, own), job.shared_tokens)
        session = _session(job, sessions, prompt) if job.fingerprints else None
        for fingerprint in job.fingerprints:
            keyer = keyers.get(fingerprint)
            if keyer is None:
                blocks[fingerprint] = EMPTY
            else:
                blocks[fingerprint] = _blocks(keyer, prompt, salt, session, keyers.turns)
    head = (
        head_of(job.route, body) if job.learn and invalid is None and prompt is not None else None
    )
    model = model if isinstance(model, str) else None
    return Prepared(True, model, sessions, blocks, invalid, head=head)


def _invalid(
    prompt: Prompt | None, keyers: Sequence[Keyer], max_context: int | None
) -> Invalid | None:
    if isinstance(prompt, TextPrompt) and not isinstance(prompt.prompt, str):
        vocab = {k.vocab_size for k in keyers if isinstance(k, LayoutKeyer)}
        bound = max(vocab) if vocab else TOKEN_ID_LIMIT
        if any(not 0 <= t < bound for t in prompt.prompt):
            return Invalid(f"prompt token ids must be in [0, {bound})", "prompt")
    if prompt is None or max_context is None:
        return None
    layouts = [k for k in keyers if isinstance(k, LayoutKeyer)]
    if not layouts:
        return None
    at_least = min(_fewest_tokens(prompt, k.max_token_bytes) for k in layouts)
    if at_least <= max_context:
        return None
    what = "messages" if isinstance(prompt, ChatPrompt) else "prompt"
    return Invalid(
        f"This model's maximum context length is {max_context} tokens. However, your "
        f"{what} resulted in at least {at_least} tokens.",
        what,
        "context_length_exceeded",
    )


def _fewest_tokens(prompt: Prompt, max_token_bytes: int) -> int:
    """No tokenizer whose longest token has `max_token_bytes` bytes makes fewer."""
    if isinstance(prompt, TextPrompt):
        if not isinstance(prompt.prompt, str):
            return len(prompt.prompt)
        size = _utf8_size(prompt.prompt)
    else:
        size = sum(_utf8_size(_text(m.get("content"))) for m in prompt.messages)
    return math.ceil(size / max(1, max_token_bytes))


def _text(content: Any) -> str:
    return content if isinstance(content, str) else ""


def _utf8_size(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def _session(job: Job, values: Sequence[str | None], prompt: Prompt) -> str | None:
    """The tenant's session the request continues (`turn_memo`): a session key from its
    headers or body, else its conversation's head (its messages up to the first user
    message's); None for a completion."""
    if not isinstance(prompt, ChatPrompt):
        return None
    found = job.session or next((v for v in values if v), None)
    if found is None:
        head = []
        for message in prompt.messages[:_HEAD_MESSAGES]:
            head.append(message)
            if message.get("role") == "user":
                break
        try:
            text = json.dumps(head, sort_keys=True).encode("utf-8", "surrogatepass")
        except (TypeError, ValueError, RecursionError):
            return None
        found = "head:" + hashlib.blake2b(text, digest_size=16).hexdigest()
    return f"{job.tenant or ''}\0{capped(found)}"


def _blocks(
    keyer: Keyer, prompt: Prompt, salt: Salt, session: str | None, turns: TurnMemo
) -> RequestBlocks:
    try:
        if isinstance(prompt, ChatPrompt):
            if session is not None and isinstance(keyer, LayoutKeyer):
                return turns.chat(
                    keyer, session, prompt.messages, prompt.tools, prompt.template_kwargs, salt
                )
            return keyer.chat(prompt.messages, prompt.tools, prompt.template_kwargs, salt)
        return keyer.completion(prompt.prompt, salt)
    except (KeyError, TypeError, ValueError, PromptError, RecursionError, struct.error):
        return EMPTY  # the backend answers it with its own 400
