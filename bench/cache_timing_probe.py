"""A prompt-cache timing attack on the fleet, as a shared LLM cache's user would mount
it: can one client tell, by the time to first token, whether another client's prompt is
in the cache? Measured within one tenant (the attack works: the control) and across
tenants (the tenant salt keys each tenant's blocks apart: it must not).

One `warmfleet serve` on the embedded SmolLM2-135M behind a `warmfleet router`, both with
a keys file naming two tenants, `victim` and `attacker`. Each trial: the victim sends a
prompt with a secret of its own (a system prompt of `--tokens` tokens, a fresh secret
every trial), then the attacker sends a guess of it, streamed, and reads its TTFT: half
the trials the victim's very system prompt (a right guess), half another secret of the
same length (a wrong one), each with a question of its own, in a shuffled order. The
score is the TTFT (lower: "cached"); the AUC is the chance a right guess is faster than
a wrong one (Mann-Whitney: 1.0 separates them perfectly, 0.5 is a coin). Within a
tenant the attacker holds the victim's key; across tenants its own. Repeated `--runs`
times; prints each run's AUC and TTFTs, then the medians and ranges.

    .venv/bin/python bench/cache_timing_probe.py [--trials 16] [--runs 3] [--tokens 400]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness.client import stream_chat
from harness.figures import spread
from harness.warmfleet import router, serve, wait_following
from harness.workloads import QUESTIONS, system_prompt

KEYS = {"victim": "sk-victim-0123456789abcdef", "attacker": "sk-attacker-0123456789abcd"}
TOKEN = "probe-admin-token-0123"


def auc(right: list[float], wrong: list[float]) -> float:
    """P(a right guess's TTFT < a wrong one's), ties counting half (Mann-Whitney U)."""
    wins = sum((r < w) + 0.5 * (r == w) for r in right for w in wrong)
    return wins / (len(right) * len(wrong))


def ttft(url: str, key: str, system: str, question: str) -> float:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    headers = {"Authorization": f"Bearer {key}"}
    s = stream_chat(url, "default", messages, 1, headers)
    end = s.first_at if s.first_at is not None else s.ended_at
    return end - s.sent_at


def run(url: str, attacker: str, trials: int, tokens: int, tokenizer: object, seed: int) -> dict:
    rng = random.Random(seed)
    labels = [True, False] * (trials // 2)
    rng.shuffle(labels)
    right: list[float] = []
    wrong: list[float] = []
    for i, guessed_right in enumerate(labels):
        secret = system_prompt(tokenizer, tokens, f"secret-{seed}-{i}-{rng.random()}")
        other = system_prompt(tokenizer, tokens, f"decoy-{seed}-{i}-{rng.random()}")
        ttft(url, KEYS["victim"], secret, QUESTIONS[i % len(QUESTIONS)])
        time.sleep(0.5)  # the victim's next-turn prefill (idle priority) ends meanwhile
        guess = secret if guessed_right else other
        took = ttft(url, KEYS[attacker], guess, f"{QUESTIONS[(i + 3) % len(QUESTIONS)]} ({i})")
        (right if guessed_right else wrong).append(took)
        time.sleep(0.5)
    return {"auc": auc(right, wrong), "right": right, "wrong": wrong}


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    fields = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
    return f"{fields.get('Model name', '?').strip()}, {fields.get('CPU(s)', '?').strip()} CPUs"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--trials", type=int, default=16, help="guesses per run and setting (even)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=400, help="the secret system prompt's length")
    args = ap.parse_args()
    from warmfleet_daemon.models.loader import load_gguf_tokenizer_only

    tokenizer = load_gguf_tokenizer_only()
    folder = Path(tempfile.mkdtemp(prefix="cache-timing-probe-"))
    keys = folder / "api-keys"
    keys.write_text("".join(f"{tenant} {key}\n" for tenant, key in KEYS.items()))
    print(f"machine: {cpu_model()}; python {sys.version.split()[0]}; pid {os.getpid()}")
    print(
        f"settings: embedded SmolLM2-135M, 1 daemon behind a router, secrets of {args.tokens} "
        f"tokens, {args.trials} guesses per run and setting (half right), max_tokens 1"
    )
    auth = {"Authorization": f"Bearer {TOKEN}"}
    results: dict[str, list[dict]] = {"within": [], "across": []}
    options = ("--api-keys-file", str(keys), "--log-level", "warning")
    with (
        serve(*options, token=TOKEN) as daemon,
        router([daemon.url], *options, token=TOKEN) as front,
    ):
        wait_following(front.url, auth)
        for n in range(args.runs):
            for setting, attacker in (("within", "victim"), ("across", "attacker")):
                found = run(front.url, attacker, args.trials, args.tokens, tokenizer, n)
                results[setting].append(found)
                print(
                    f"run {n + 1} {setting:>6}: AUC {found['auc']:.3f}; TTFT right guesses "
                    f"{spread(found['right'])} s, wrong {spread(found['wrong'])} s",
                    flush=True,
                )
    for setting, runs in results.items():
        aucs = [r["auc"] for r in runs]
        rights = [statistics.median(r["right"]) for r in runs]
        wrongs = [statistics.median(r["wrong"]) for r in runs]
        print(
            f"{setting:>6} tenant: AUC median {statistics.median(aucs):.3f} "
            f"(range {min(aucs):.3f}-{max(aucs):.3f}, {len(aucs)} runs); median TTFT right "
            f"{statistics.median(rights):.3f} s, wrong {statistics.median(wrongs):.3f} s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
