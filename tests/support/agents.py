"""The first requests of the real agent CLIs (recorded, trimmed copies in data/), and
the same requests as another session would send them: another user prompt, and with
it everything the CLIs change per session (Claude Code's billing-header fingerprint and
session id, Codex's thread id and item ids)."""

from __future__ import annotations

import copy
import hashlib
import json
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DATA = Path(__file__).with_name("data")
CLAUDE_CODE = DATA / "claude-code-2.1.332.json"
CODEX = DATA / "codex-0.171.0.json"


@dataclass(frozen=True)
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


def _load(path: Path) -> Recorded:
    data = json.loads(path.read_text())
    return Recorded(data["method"], data["path"], data["headers"], data["body"])


def claude_code(prompt: str | None = None, model: str | None = None) -> Recorded:
    """Claude Code's first request; with `prompt`, as a new session asking that."""
    rec = _load(CLAUDE_CODE)
    body, headers = copy.deepcopy(rec.body), dict(rec.headers)
    if prompt is not None:
        session = str(uuid.uuid4())
        # cc_version=2.1.332.<3 hex chars hashed from the first prompt>
        fingerprint = hashlib.sha256(prompt.encode()).hexdigest()[:3]
        billing = body["system"][0]
        billing["text"] = billing["text"].replace("2.1.332.0b8", f"2.1.332.{fingerprint}")
        body["messages"][0]["content"][-1]["text"] = prompt
        user = json.loads(body["metadata"]["user_id"])
        body["metadata"]["user_id"] = json.dumps({**user, "session_id": session})
        headers["X-Claude-Code-Session-Id"] = session
    if model is not None:
        body["model"] = model
    return Recorded(rec.method, rec.path, headers, body)


def codex(prompt: str | None = None, model: str | None = None) -> Recorded:
    """Codex's first request; with `prompt`, as a new thread asking that."""
    rec = _load(CODEX)
    body, headers = copy.deepcopy(rec.body), dict(rec.headers)
    if prompt is not None:
        thread = str(uuid.uuid4())
        body["input"][-1]["content"][0]["text"] = prompt
        for item in body["input"]:
            item["id"] = f"msg_{uuid.uuid4()}"
        body["prompt_cache_key"] = thread
        body["client_metadata"] = {k: thread for k in body["client_metadata"]}
        headers.update({"session-id": thread, "thread-id": thread})
    if model is not None:
        body["model"] = model
    return Recorded(rec.method, rec.path, headers, body)
