"""An agent's prompt keyed once (`turn_memo`): a session's request keyed as the
continuation of its last one has exactly the blocks of the request keyed whole, across
sessions, tenants' salts and edits; the memo stays within its count and byte budget;
`prepare` keys a session's requests through it, per tenant."""

from __future__ import annotations

import copy
import functools
import gc
import json
import random
import tracemalloc
from typing import Any

from support.layouts import tiny_layout
from warmfleet_common.cache_layout import export_layout
from warmfleet_common.chunking import root_key
from warmfleet_common.tenancy import cache_salt
from warmfleet_daemon.models.loader import load_gguf_tokenizer_only
from warmfleet_router.keys import UNSALTED, LayoutKeyer, Salt
from warmfleet_router.prepare import Job, KeyerCache, Prepared, prepare
from warmfleet_router.turn_memo import TurnMemo
from warmfleet_router.workers import KeyingPool

TOOLS = [{"type": "function", "function": {"name": "run", "description": "Run a command"}}]
WORDS = ["the", " file", "\n", "def", " x", "1", "é", "<|im_end|>", "  ", "ok", "\n\n"]


@functools.cache
def keyers() -> tuple[LayoutKeyer, LayoutKeyer]:
    layout = export_layout(load_gguf_tokenizer_only(), model="m", root=root_key("m"), block_size=16)
    return LayoutKeyer(layout), LayoutKeyer(layout)


def words(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(WORDS) for _ in range(rng.randint(0, n)))


def test_sessions_keyed_through_the_memo_get_the_blocks_keyed_whole() -> None:
    rng = random.Random(45)
    memo_keyer, whole_keyer = keyers()
    memo = TurnMemo()
    salts = [UNSALTED, Salt(b"tenant-a", 60), Salt(b"tenant-b", 0)]
    conversations: dict[str, list[dict[str, Any]]] = {}
    for step in range(160):
        session = rng.choice(["a", "b", "c"])
        messages = conversations.setdefault(
            session, [{"role": "system", "content": "Be terse. " * 20}]
        )
        action = rng.random()
        if action < 0.6 or len(messages) < 3:
            messages += [
                {"role": "assistant", "content": words(rng, 30)},
                {"role": "user", "content": words(rng, 10) or "go"},
            ][(1 if len(messages) == 1 else 0) :]
        elif action < 0.75:
            rng.choice(messages[1:])["content"] = words(rng, 10)  # history edited
        elif action < 0.85:
            del messages[-2:]  # the last turn again
        tools = TOOLS if step % 7 else None
        salt = rng.choice(salts) if action > 0.95 else salts[hash(session) % 3]
        other = rng.random() < 0.05  # another conversation under the session's key
        sent = copy.deepcopy(conversations["a" if other else session])
        found = memo.chat(memo_keyer, session, sent, tools, None, salt)
        assert found == whole_keyer.chat(copy.deepcopy(sent), tools, None, salt), step
    assert memo.continued > 60 and memo.whole > 10


def test_the_memo_forgets_the_least_recently_used_session_first() -> None:
    keyer, _ = keyers()
    memo = TurnMemo(max_sessions=2)
    chat = [{"role": "user", "content": "hello"}]
    for session in ("a", "b", "a", "c"):
        memo.chat(keyer, session, chat, None)
    assert len(memo) == 2 and memo.forgotten == 1
    memo.chat(keyer, "a", [*chat, {"role": "assistant", "content": "x"}], None)
    assert memo.continued == 2  # "a" was kept: it was used after "b"


def test_the_memo_keeps_to_its_byte_budget() -> None:
    keyer, _ = keyers()
    memo = TurnMemo(budget_bytes=200_000)
    for session in range(20):
        memo.chat(keyer, str(session), [{"role": "user", "content": "word " * 600}], None)
        assert memo.size_bytes <= memo.budget_bytes
    assert 0 < len(memo) < 20 and memo.forgotten > 0
    memo.chat(keyer, "huge", [{"role": "user", "content": "word " * 40_000}], None)
    assert memo.size_bytes <= memo.budget_bytes  # too large for a quarter: not kept


def test_prepare_keys_a_session_through_its_memo_per_tenant() -> None:
    layout = tiny_layout(block_size=4)
    keyers = KeyerCache(None)
    keyer = keyers.add(layout)
    assert isinstance(keyer, LayoutKeyer)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "hi"}]
    for turn in range(3):
        body = json.dumps({"model": "m", "messages": messages}).encode()
        # A session key, the conversation's head; and the same key of another tenant.
        for session, tenant in (("s1", "t"), (None, "t"), ("s1", "u")):
            job = Job("chat", body, (layout.fingerprint,), tenant=tenant, session=session)
            prepared = prepare(job, keyers)
            assert isinstance(prepared, Prepared)
            whole = keyer.chat(messages, None, salt=Salt(cache_salt(tenant, None)))
            assert prepared.blocks[layout.fingerprint] == whole
        messages += [{"role": "assistant", "content": f"a{turn}"}, {"role": "user", "content": "b"}]
    assert keyers.turns.continued == 6 and len(keyers.turns) == 3


def test_an_entry_holds_no_more_than_it_counts() -> None:
    keyer, _ = keyers()
    memo = TurnMemo()
    rng = random.Random(7)
    chats = [
        json.dumps(
            [{"role": "system", "content": "Be terse. " * 50}]
            + [{"role": r, "content": words(rng, 60) or "x"} for r in ["user", "assistant"] * 20]
            + [{"role": "user", "content": "go"}]
        )
        for _ in range(4)
    ]
    for i, chat in enumerate(chats):  # the builder's own memos filled first
        memo.chat(keyer, f"warm{i}", json.loads(chat), TOOLS)
    memo = TurnMemo()
    tracemalloc.start()
    try:
        for i, chat in enumerate(chats):
            memo.chat(keyer, str(i), json.loads(chat), TOOLS)
        gc.collect()
        full = tracemalloc.get_traced_memory()[0]
        memo._entries.clear()
        gc.collect()
        held = full - tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert 0.5 * memo.size_bytes < held <= memo.size_bytes


def test_a_sessions_large_bodies_go_to_its_worker() -> None:
    pool = KeyingPool(workers=3)
    try:
        chosen = {pool._worker_for(Job("chat", b"", session=f"s{i}")).name for i in range(12)}
        assert len(chosen) > 1
        first = pool._worker_for(Job("chat", b"", session="s1"))
        assert all(pool._worker_for(Job("chat", b"", session="s1")) is first for _ in range(3))
    finally:
        pool._threads.shutdown()


def test_agents_bodies_keyed_through_the_memo_get_the_blocks_keyed_whole() -> None:
    """Claude Code's and Codex's requests as the CLIs send them (`warmfleet sim trace`)."""
    from warmfleet_cli.sim import trace as traces
    from warmfleet_cli.sim.bodies import BodyOptions, SessionBodies
    from warmfleet_router.routes import BY_NAME

    memo_keyer, whole_keyer = keyers()
    memo = TurnMemo()
    params = traces.TraceParams(upgrades=(), node_lost=None, nodes_added=None,
                                rolling_restart=None)  # fmt: skip
    trace = traces.generate(params)
    sessions = [s for s in traces.sessions(trace.records).values() if s[0]["turn"] == 0]
    agents = {s[0]["agent"] for s in sessions[:6]}
    for steps in sessions[:6]:
        bodies = SessionBodies(BodyOptions.of(trace.header))
        for step in steps[:4]:
            request = bodies.request(step)
            route = "messages" if request.path.startswith("/v1/messages") else "responses"
            body = json.loads(json.dumps(request.body))
            prompt = BY_NAME[route].prompt_of(body)
            found = memo.chat(memo_keyer, step["session"], prompt.messages, prompt.tools)
            again = BY_NAME[route].prompt_of(json.loads(json.dumps(request.body)))
            assert found == whole_keyer.chat(again.messages, again.tools)
    assert memo.continued > 3 and len(agents) == 2
