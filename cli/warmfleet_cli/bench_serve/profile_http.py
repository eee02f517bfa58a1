"""What `bench-serve --profile-out` asks a daemon over HTTP: timed streamed completions of
token-id prompts (exact lengths, block-aligned), chats, the status, waiting until the
daemon is idle, clearing its prefix cache, and warm sets (to leave blocks on disk only).
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from warmfleet_cli.bench_serve.serve import (
    BenchError,
    _describe,
    _error_message,
    delete_prefix_cache,
)

_POLL_S = 0.05
WARM_NAMESPACE = "warmfleet-bench"


@dataclass(frozen=True)
class Timed:
    """One streamed request as the client saw it: each token's arrival, in seconds from
    just before it was sent."""

    times: tuple[float, ...]
    completion_tokens: int
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    by_tier: dict[str, int] = field(default_factory=dict)  # usage.cached_tokens_by_tier

    @property
    def ttft_s(self) -> float:
        return self.times[0]

    @property
    def decode_tokens_per_s(self) -> float | None:
        """One sequence's rate from its second token on: a cached prompt's first token
        comes from its stored logits, and the daemon restores its caches (lazily) in the
        step that makes the second."""
        if self.completion_tokens < 3 or len(self.times) < 3 or self.times[-1] <= self.times[1]:
            return None
        return (self.completion_tokens - 2) / (self.times[-1] - self.times[1])

    @property
    def restore_gap_s(self) -> float | None:
        """From the first token to the second, less a decode step (the median of the
        later ones): for a fully cached prompt, the restore of its caches."""
        if len(self.times) < 4:
            return None
        steps = [b - a for a, b in zip(self.times[1:], self.times[2:], strict=False)]
        return self.times[1] - self.times[0] - statistics.median(steps)


class Server:
    """One daemon, asked with the admin token (if any) on every route."""

    def __init__(
        self, client: httpx.AsyncClient, model: str, admin_token: str | None, timeout_s: float
    ) -> None:
        self.client = client
        self.model = model
        self.timeout_s = timeout_s
        self._auth = {"Authorization": f"Bearer {admin_token}"} if admin_token else {}

    async def complete(self, prompt: list[int], max_tokens: int) -> Timed:
        """A completion of exactly `max_tokens` tokens (ignore_eos) of a token-id prompt."""
        body = {"prompt": prompt, "max_tokens": max_tokens}
        return await self._stream("/v1/completions", body)

    async def chat(self, texts: list[str], max_tokens: int) -> Timed:
        """A chat of user messages."""
        messages = [{"role": "user", "content": t} for t in texts]
        body = {"messages": messages, "max_tokens": max_tokens}
        return await self._stream("/v1/chat/completions", body)

    async def _stream(self, path: str, body: dict[str, Any]) -> Timed:
        body = {
            **body,
            "model": self.model,
            "temperature": 0.0,
            "ignore_eos": True,  # vLLM's extension, the daemon's too: outputs of fixed length
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        started = time.perf_counter()
        times: list[float] = []
        usage: dict[str, Any] = {}
        try:
            async with self.client.stream("POST", path, json=body) as response:
                if response.status_code != 200:
                    await response.aread()
                    raise BenchError(
                        f"POST {path} answered {response.status_code}: {_error_message(response)}"
                    )
                async for line in response.aiter_lines():
                    data = line.removeprefix("data:").strip()
                    if not line.startswith("data:") or data == "[DONE]":
                        continue
                    chunk = json.loads(data)
                    if chunk.get("error"):
                        raise BenchError(f"POST {path}: error in stream: {chunk['error']}")
                    if isinstance(chunk.get("usage"), dict):
                        usage = chunk["usage"]
                    for choice in chunk.get("choices") or []:
                        text = choice.get("text") or (choice.get("delta") or {}).get("content")
                        # A token may carry no text yet (a split character): the finish
                        # then times a response that showed none.
                        if text or (choice.get("finish_reason") and not times):
                            times.append(time.perf_counter() - started)
        except httpx.HTTPError as exc:
            raise BenchError(f"POST {path} failed: {_describe(exc)}") from exc
        except json.JSONDecodeError as exc:
            raise BenchError(f"POST {path}: a stream chunk is not JSON: {exc}") from exc
        if not times:
            raise BenchError(f"POST {path}: the stream carried no token")
        details = usage.get("prompt_tokens_details") or {}
        tiers = usage.get("cached_tokens_by_tier") or {}
        return Timed(
            times=tuple(times),
            completion_tokens=int(usage.get("completion_tokens") or len(times)),
            prompt_tokens=_int(usage.get("prompt_tokens")),
            cached_tokens=_int(details.get("cached_tokens") if isinstance(details, dict) else None),
            by_tier={str(k): int(v) for k, v in tiers.items()} if isinstance(tiers, dict) else {},
        )

    async def get(self, path: str) -> Any:
        """A GET route's JSON, or None when the route is not there or not JSON."""
        try:
            response = await self.client.get(path, headers=self._auth, timeout=30)
            return response.json() if response.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None

    async def status(self) -> dict[str, Any]:
        status = await self.get("/v1/status")
        return status if isinstance(status, dict) else {}

    async def wait_idle(self) -> None:
        """Until nothing runs, waits, prefills at idle priority (next turns, warm-ups) or
        waits to be written to disk, twice in a row: a measurement shares the CPU with
        nothing of ours (2 cores: the disk writer alone moves a TTFT)."""
        deadline = time.monotonic() + self.timeout_s
        quiet = 0
        while quiet < 2:
            status = await self.status()
            quiet = quiet + 1 if _idle(status) else 0
            if time.monotonic() > deadline:
                raise BenchError(f"the daemon did not go idle in {self.timeout_s:.0f}s")
            await asyncio.sleep(_POLL_S)

    async def clear(self) -> str | None:
        """DELETE /v1/cache/prefix; None when cleared, else why it could not be."""
        response = await delete_prefix_cache(self.client, self._auth, self.timeout_s)
        if response.status_code >= 300:
            return f"DELETE /v1/cache/prefix answered {response.status_code}"
        return None

    async def warm(self, name: str, texts: list[str]) -> str | None:
        """Warm one chat prompt per text as a warm set (unpinned) and wait until it is
        warm; None when it is, else why not."""
        prompts = [
            {"name": f"p{i}", "messages": [{"role": "user", "content": t}]}
            for i, t in enumerate(texts)
        ]
        path = f"/v1/warm-sets/{WARM_NAMESPACE}/{name}"
        body = {"prompts": prompts, "pin": False, "concurrency": 1}
        try:
            response = await self.client.put(path, json=body, headers=self._auth)
        except httpx.HTTPError as exc:
            return f"PUT {path} failed: {_describe(exc)}"
        if response.status_code >= 300:
            return f"PUT {path} answered {response.status_code}: {_error_message(response)}"
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            state = await self.get(path)
            found = [p.get("state") for p in (state or {}).get("prompts") or []]
            if "failed" in found:
                return f"warm-up failed: {state}"
            if found and all(s == "warm" for s in found):
                return None
            await asyncio.sleep(_POLL_S * 4)
        return f"the warm set did not warm in {self.timeout_s:.0f}s"

    async def delete_warm_set(self, name: str) -> None:
        path = f"/v1/warm-sets/{WARM_NAMESPACE}/{name}"
        try:
            response = await self.client.delete(path, headers=self._auth)
        except httpx.HTTPError as exc:
            raise BenchError(f"DELETE {path} failed: {_describe(exc)}") from exc
        if response.status_code >= 300:
            raise BenchError(f"DELETE {path} answered {response.status_code}")


def _idle(status: dict[str, Any]) -> bool:
    engine = status.get("engine") or {}
    busy = sum(int(engine.get(k) or 0) for k in ("running", "prefilling", "waiting"))
    busy += int(engine.get("idle_waiting") or 0)
    busy += int((status.get("next_turn") or {}).get("pending") or 0)
    busy += int((status.get("disk_tier") or {}).get("queued_blocks") or 0)
    return busy == 0


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) else None
