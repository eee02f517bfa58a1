"""Two daemons behind the router, one overloaded: a spilled session's TTFT through the
peer copy against its re-prefill (#20's Done-when: <= 0.25x).

Two `warmfleet serve` daemons (the embedded SmolLM2-135M, `--max-context`, one admin
token, `--spill auto` or as given) behind `warmfleet router` (prefix policy, bounded
load). Per session (the agent transcripts of bench/long_sessions.py, a few thousand
tokens each):

  1. its first turn goes through the router with a session key and lands on a daemon
     (the holder), which prefills and stores the whole history;
  2. two long generations are put in flight on the holder (sessions the router pins
     there), so it is overloaded: with two daemons the bounded-load filter keeps a third
     request off a daemon that holds two while the other holds none;
  3. the session's next turn goes through the router: it is spilled to the other daemon,
     which the router tells to copy the session's blocks from the holder (timed: the
     "spilled" TTFT, the client's, through the router);
  4. the other daemon's cache is cleared and the same turn is sent to it directly: it
     prefills the whole history (the "re-prefill" TTFT), with the holder still loaded;
  5. the load ends, both caches keep what they hold, the next session starts.

The other daemon's cache is cleared before each spilled turn too, so both measurements
start from nothing there (the shared system prompt is not a RAM hit for either).

    .venv/bin/python bench/fleet_spill.py [--sessions 4] [--min-tokens 3000] \\
        [--max-tokens 4000] [--spill auto|always]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from harness.client import Turn, turn
from harness.figures import spread
from harness.peers import prepare
from harness.warmfleet import router, serve, wait_following
from harness.workloads import ASKS, transcripts

TOKEN = "fleet-spill-bench"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def router_status(url: str) -> dict[str, Any]:
    return dict(httpx.get(f"{url}/v1/router/status", headers=AUTH, timeout=30).json())


def routed(url: str, messages: list[dict[str, Any]], key: str, max_tokens: int) -> tuple[Turn, str]:
    """One streamed turn through the router with a session key: the turn and the backend."""
    t = turn(url, "default", messages, max_tokens, {"x-session-affinity": key})
    return t, t.backend


class Load:
    """Long generations in flight on one backend through the router (sessions pinned
    there), until closed."""

    def __init__(self, router_url: str, keys: list[str]) -> None:
        self.stop = threading.Event()
        self.threads = [
            threading.Thread(target=self._generate, args=(router_url, k), daemon=True) for k in keys
        ]
        for t in self.threads:
            t.start()

    def _generate(self, url: str, key: str) -> None:
        body = {
            "model": "default", "max_tokens": 4000, "temperature": 0.0, "stream": True,
            "ignore_eos": True,
            "messages": [
                {"role": "system", "content": key},
                {"role": "user", "content": "Write a long story."},
            ],
        }  # fmt: skip
        headers = {"x-session-affinity": key}
        with httpx.stream(
            "POST", f"{url}/v1/chat/completions", json=body, headers=headers, timeout=1800
        ) as r:
            for _ in r.iter_lines():
                if self.stop.is_set():
                    return  # closing the stream cancels the generation

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=60)


def keys_on(router_url: str, holder: str, count: int, taken: set[str]) -> list[str]:
    """Session keys the router places on `holder` (a short request each, pinning it)."""
    found: list[str] = []
    for i in range(200):
        key = f"load-{holder}-{i}"
        if key in taken:
            continue
        # A system prompt of its own: no daemon holds any of it, so the key's hash decides.
        short = [{"role": "system", "content": key}, {"role": "user", "content": "Hi"}]
        _, backend = routed(router_url, short, key, 1)
        taken.add(key)
        if backend == holder:
            found.append(key)
            if len(found) == count:
                return found
    raise RuntimeError(f"no session key lands on {holder}")


def in_flight(router_url: str, name: str) -> int:
    backends = router_status(router_url)["backends"]
    return int(next(b["in_flight"] for b in backends if b["name"] == name))


def clear(url: str) -> None:
    httpx.delete(f"{url}/v1/cache/prefix", headers=AUTH, timeout=60).raise_for_status()


def spill_stats(url: str) -> dict[str, Any]:
    status = httpx.get(f"{url}/v1/status", headers=AUTH, timeout=30).json()
    return dict(status["kv_transfer"]["spill"]) | {"costs": status.get("tier_costs")}


@dataclass
class Result:
    prompt_tokens: int
    spilled: Turn
    prefill: Turn
    peer: str | None
    reason: str | None


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--sessions", type=int, default=4)
    ap.add_argument("--min-tokens", type=int, default=3000)
    ap.add_argument("--max-tokens", type=int, default=4000)
    ap.add_argument("--answer-tokens", type=int, default=16)
    ap.add_argument("--spill", choices=["auto", "always"], default="auto")
    ap.add_argument("--model-dir", default=None, help="converted model (default: a temp dir)")
    args = ap.parse_args()
    print(f"load: {os.getloadavg()}", flush=True)
    tokenizer, _ = prepare(args.model_dir)
    sessions = transcripts(tokenizer, args.sessions, args.min_tokens, args.max_tokens)
    context = args.max_tokens + 8192
    token_file = Path(tempfile.mkstemp(prefix="fleet-spill-token-")[1])
    token_file.write_text(TOKEN)
    results: list[Result] = []
    with ExitStack() as stack:
        serving = ["--max-context", str(context), "--spill", args.spill, "--log-level", "info"]
        urls = [stack.enter_context(serve(*serving, token=TOKEN)).url for _ in range(2)]
        by_name = {u.removeprefix("http://"): u for u in urls}
        routing = ["--admin-token-file", str(token_file), "--health-interval", "1"]
        r = stack.enter_context(router(urls, *routing)).url
        wait_following(r, AUTH, poll=0.2)
        print(f"daemons {urls}, router {r}; costs {spill_stats(urls[0])['costs']}", flush=True)
        taken: set[str] = set()
        for i, s in enumerate(sessions):
            key = f"session-{i}"
            first, holder = routed(r, s.messages, key, args.answer_tokens)
            s.messages.append({"role": "assistant", "content": first.text})
            s.messages.append({"role": "user", "content": ASKS[i % len(ASKS)]})
            other = next(u for n, u in by_name.items() if n != holder)
            print(
                f"session {i}: {first.prompt_tokens} tokens, cold on {holder} TTFT "
                f"{first.ttft_s:.2f} s",
                flush=True,
            )
            time.sleep(1.0)  # the holder stores the answer (the next turn's prefix)
            load = Load(r, keys_on(r, holder, 2, taken))
            try:
                deadline = time.monotonic() + 60
                while in_flight(r, holder) < 2:
                    assert time.monotonic() < deadline, "the load never reached the holder"
                    time.sleep(0.05)
                clear(other)
                spilled, went = routed(r, s.messages, key, args.answer_tokens)
                decision = next(d for d in router_status(r)["decisions"] if d["backend"] == went)
                clear(other)
                prefill = turn(other, "default", s.messages, args.answer_tokens)
            finally:
                load.close()
            results.append(
                Result(first.prompt_tokens, spilled, prefill, decision["peer"], decision["reason"])
            )
            print(
                f"  spilled to {went} ({decision['reason']}, peer {decision['peer']}): TTFT "
                f"{spilled.ttft_s:.2f} s, cached {spilled.cached_tokens}; re-prefill there "
                f"{prefill.ttft_s:.2f} s (cached {prefill.cached_tokens}); ratio "
                f"{spilled.ttft_s / prefill.ttft_s:.3f}; same answer: "
                f"{spilled.text == prefill.text}",
                flush=True,
            )
        stats = {u: spill_stats(u) for u in urls}
    token_file.unlink(missing_ok=True)

    print(f"\nload at the end: {os.getloadavg()}")
    for url, st in stats.items():
        rate = st["bytes"] / st["seconds"] / 1e6 if st["seconds"] else 0.0
        print(
            f"{url}: {st['copies']} copies, {st['declined']} declined, {st['short']} short, "
            f"{st['failed']} failed, "
            f"{st['tokens']} tokens, {st['bytes'] / (1 << 20):.1f} MiB in {st['seconds']:.2f} s "
            f"({rate:.0f} MB/s)"
        )
    print("TTFT in seconds, median (min-max, n):")
    print(f"  prompt tokens            {spread([float(x.prompt_tokens) for x in results])}")
    print(f"  spilled (peer copy)      {spread([x.spilled.ttft_s for x in results])}")
    print(f"  re-prefill on the other  {spread([x.prefill.ttft_s for x in results])}")
    ratios = [x.spilled.ttft_s / x.prefill.ttft_s for x in results]
    print(f"  spilled / re-prefill     {spread(ratios)}  (target <= 0.25)")
    same = sum(x.spilled.text == x.prefill.text for x in results)
    print(f"greedy answers, spilled vs re-prefilled: {same} of {len(results)} identical")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
