"""`warmfleet bench-serve`: stream chat requests at an OpenAI-compatible server and
measure what a client sees, per prompt set and concurrency ("cell").

Every request streams (with `stream_options.include_usage`), so TTFT is the time to
the first generated token and the usage chunk gives prompt, cached and completion
tokens. A cell sends `requests` requests (default: one burst of `concurrency`) with at
most `concurrency` in flight, `repetitions` times. Nothing is sent that is not
measured: no warm-up or token-counting request could pre-fill the prefix being
measured. With `--cache-policy clear-before-run` each cell starts from a cleared
prefix cache (`DELETE /v1/cache/prefix`); a warmfleet daemon re-warms its warm sets
after a clear, and the benchmark waits for that, so every cell starts as a freshly
started (and, if it has warm prompts, freshly warmed) server would.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

from warmfleet_cli.bench_serve.counters import Counters, parse_prometheus_counters
from warmfleet_cli.bench_serve.prompt_sets import BenchPrompt, PromptSet
from warmfleet_cli.bench_serve.stats import CellStats, RequestResult, cell_stats
from warmfleet_common import __version__
from warmfleet_common.tls import TlsOptions, client_verify

CACHE_POLICIES = ("preserve", "clear-before-run")
# Prometheus counters of prefix-cache tokens (hits, lookups): warmfleet's, then vLLM's.
_POLL_S = 0.25
DEFAULT_MODEL = "default_model"  # mlx_lm.server's name for the model it was started with

ROW_FIELDS = (
    "tag",
    "run_id",
    "started_at",
    "server_url",
    "server_software",
    "model",
    "prompt_set",
    "concurrency",
    "requests",
    "repetitions",
    "max_tokens",
    "cache_policy",
    "ok",
    "errors",
    "length_finishes",
    "ttft_p50_ms",
    "ttft_p95_ms",
    "ttft_mean_ms",
    "tpot_p50_ms",
    "tpot_p95_ms",
    "tpot_mean_ms",
    "e2e_p50_ms",
    "e2e_p95_ms",
    "e2e_mean_ms",
    "prompt_tokens_mean",
    "cached_tokens_mean",
    "completion_tokens_mean",
    "cached_token_share",
    "request_throughput_rps",
    "output_tokens_per_s",
    "duration_s",
    "server_counters",
    "server_hit_tokens",
    "server_queried_tokens",
    "server_hit_rate",
    "first_error",
)


class BenchError(Exception):
    """The benchmark cannot run (server unreachable, bad options); nothing measured."""


class Progress(Protocol):
    def cell(self, label: str, total: int) -> None: ...
    def advance(self) -> None: ...
    def note(self, text: str) -> None: ...


class NoProgress:
    def cell(self, label: str, total: int) -> None:
        pass

    def advance(self) -> None:
        pass

    def note(self, text: str) -> None:
        pass


@dataclass(frozen=True)
class BenchOptions:
    url: str
    prompt_sets: Sequence[PromptSet]
    concurrency: Sequence[int]
    model: str | None = None
    max_tokens: int = 64
    requests: int | None = None  # per cell and repetition; None: one burst of `concurrency`
    repetitions: int = 1
    tag: str = ""
    cache_policy: str = "preserve"
    admin_token: str | None = None
    timeout_s: float = 600.0
    api_key: str | None = None  # a client key: sent with every request but the admin's
    tls_ca: str | None = None  # what an https server is verified with

    def __post_init__(self) -> None:
        if not self.prompt_sets:
            raise BenchError("no prompt sets")
        if not self.concurrency or any(c < 1 for c in self.concurrency):
            raise BenchError("--concurrency needs positive integers, e.g. 1,4,8")
        if self.max_tokens < 1 or self.repetitions < 1 or (self.requests or 1) < 1:
            raise BenchError("--max-tokens, --requests and --repetitions must be >= 1")
        if self.cache_policy not in CACHE_POLICIES:
            raise BenchError(f"--cache-policy must be one of {', '.join(CACHE_POLICIES)}")


@dataclass(frozen=True)
class ServerInfo:
    url: str
    model: str
    software: str  # "warmfleet 0.1.0", or the HTTP Server header
    counters: str  # where hit counters come from: "/v1/status", "/metrics" or ""


@dataclass
class BenchRun:
    server: ServerInfo
    options: BenchOptions
    run_id: str
    started_at: str
    rows: list[dict[str, Any]] = field(default_factory=list)
    results: list[RequestResult] = field(default_factory=list)
    # The server's counters before and after each cell repetition, as read.
    counters: list[dict[str, Any]] = field(default_factory=list)

    @property
    def errors(self) -> int:
        return sum(not r.ok for r in self.results)


def base_url(url: str) -> str:
    """`http://host:8000`, `.../` and `.../v1` all mean the same server."""
    url = url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise BenchError(f"--url must start with http:// or https://, got {url!r}")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def client_headers(api_key: str | None) -> dict[str, str]:
    """Every request's: who is asking, and its client key (in both APIs' headers: an
    admin route's own Authorization replaces it)."""
    headers = {"User-Agent": f"warmfleet-bench/{__version__}"}
    if api_key:
        headers |= {"Authorization": f"Bearer {api_key}", "x-api-key": api_key}
    return headers


def run(options: BenchOptions, progress: Progress | None = None) -> BenchRun:
    return asyncio.run(run_async(options, progress or NoProgress()))


async def run_async(options: BenchOptions, progress: Progress) -> BenchRun:
    url = base_url(options.url)
    limits = httpx.Limits(max_connections=max(options.concurrency) + 4)
    timeout = httpx.Timeout(options.timeout_s, connect=10.0)
    headers = client_headers(options.api_key)
    async with httpx.AsyncClient(
        base_url=url,
        limits=limits,
        timeout=timeout,
        headers=headers,
        verify=client_verify(TlsOptions(ca=options.tls_ca)),
    ) as client:
        server = await _probe(client, url, options, progress)
        bench = BenchRun(
            server,
            options,
            run_id=uuid.uuid4().hex[:12],
            started_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        )
        for prompt_set in options.prompt_sets:
            cursor = _Cursor(prompt_set)
            for concurrency in options.concurrency:
                results: list[RequestResult] = []
                duration = hit = queried = 0.0
                counted = server.counters != ""
                for repetition in range(options.repetitions):
                    n = options.requests or concurrency
                    label = f"{prompt_set.name} c={concurrency}"
                    if options.repetitions > 1:
                        label += f" rep {repetition + 1}/{options.repetitions}"
                    if options.cache_policy == "clear-before-run":
                        progress.note(f"{label}: clearing the prefix cache")
                        await _clear_cache(client, options, progress)
                    before = await _counters(client, server.counters)
                    progress.cell(label, n)
                    batch = [cursor.next() for _ in range(n)]
                    started = time.perf_counter()
                    cell = (prompt_set.name, concurrency, repetition)
                    results += await _run_cell(
                        client, server.model, batch, concurrency, options, progress, cell
                    )
                    duration += time.perf_counter() - started
                    after = await _counters(client, server.counters)
                    bench.counters.append(
                        {
                            "prompt_set": prompt_set.name,
                            "concurrency": concurrency,
                            "repetition": repetition,
                            "before": None if before is None else vars(before),
                            "after": None if after is None else vars(after),
                        }
                    )
                    if before is None or after is None:
                        counted = False
                    else:
                        hit += after.hit_tokens - before.hit_tokens
                        queried += after.queried_tokens - before.queried_tokens
                bench.results += results
                bench.rows.append(
                    _row(
                        bench,
                        prompt_set.name,
                        concurrency,
                        cell_stats(results, duration),
                        (hit, queried) if counted else None,
                    )
                )
        return bench


async def _probe(
    client: httpx.AsyncClient, url: str, options: BenchOptions, progress: Progress
) -> ServerInfo:
    """Who is there and which model to ask for: GET requests only, nothing cached."""
    try:
        response = await client.get("/v1/models", timeout=30)
    except httpx.HTTPError as exc:
        raise BenchError(f"cannot reach {url}: {_describe(exc)}. Is the server running?") from exc
    ids: list[str] = []
    listing = f"answered HTTP {response.status_code}"
    if response.status_code == 200:
        try:
            ids = [str(m["id"]) for m in response.json().get("data", [])]
            listing = f"lists {len(ids)} models" + (f" ({', '.join(ids)})" if ids else "")
        except (ValueError, KeyError, TypeError, AttributeError):
            listing = "gave no model list"
    model = options.model
    if model is None:
        if len(ids) > 1:
            raise BenchError(
                f"GET {url}/v1/models {listing}: pass --model to choose the model to benchmark"
            )
        if not ids:
            # mlx_lm.server without a Hugging Face cache answers 200 with an empty body; it
            # serves the model it was started with under this name.
            model = DEFAULT_MODEL
            progress.note(
                f"GET {url}/v1/models {listing}: requesting model {DEFAULT_MODEL!r} (the "
                "model the server was started with); pass --model to choose"
            )
        else:
            model = ids[0]
    software = response.headers.get("server", "")
    status = await _get_json(client, "/v1/status")
    if (
        isinstance(status, dict)
        and "version" in status
        and (
            "warm_sets" in status or "warm_set_counts" in status  # the public status: counts
        )
    ):
        software = f"warmfleet {status['version']}"
    source = ""
    for candidate in ("/v1/status", "/metrics"):
        if await _counters(client, candidate) is not None:
            source = candidate
            break
    return ServerInfo(url, model, software, source)


async def delete_prefix_cache(
    client: httpx.AsyncClient, headers: dict[str, str], timeout: float = 60
) -> httpx.Response:
    """DELETE /v1/cache/prefix: its response; BenchError when it could not be sent or was
    refused for want of the admin token."""
    try:
        response = await client.delete("/v1/cache/prefix", headers=headers, timeout=timeout)
    except httpx.HTTPError as exc:
        raise BenchError(f"DELETE /v1/cache/prefix failed: {_describe(exc)}") from exc
    if response.status_code in (401, 403):
        raise BenchError(
            f"DELETE /v1/cache/prefix answered {response.status_code} "
            f"({_error_message(response)}): pass the daemon's token with --admin-token-file"
        )
    return response


async def _clear_cache(
    client: httpx.AsyncClient, options: BenchOptions, progress: Progress
) -> None:
    headers = {"Authorization": f"Bearer {options.admin_token}"} if options.admin_token else {}
    response = await delete_prefix_cache(client, headers)
    if response.status_code in (404, 405, 501):
        raise BenchError(
            f"the server has no DELETE /v1/cache/prefix (HTTP {response.status_code}): it "
            "cannot clear its cache on request. Use --cache-policy preserve, and restart "
            "the server before a cold run."
        )
    if response.status_code >= 300:
        raise BenchError(
            f"DELETE /v1/cache/prefix answered {response.status_code}: {_error_message(response)}"
        )
    try:
        rewarm = bool(response.json().get("rewarm_scheduled"))
    except (ValueError, AttributeError):
        rewarm = False
    if rewarm:  # measure from a warmed state, as after a deploy, not mid-warm-up
        progress.note("waiting for the warm sets to re-warm")
        deadline = time.monotonic() + options.timeout_s
        while True:
            try:
                ready = await client.get("/readyz", params={"warm": 1}, timeout=30)
                if ready.status_code in (200, 404):  # 404: no such route, nothing to wait for
                    return
                detail = ready.json().get("detail", ready.text)
            except (httpx.HTTPError, ValueError, AttributeError) as exc:
                detail = str(exc)
            if time.monotonic() > deadline:
                raise BenchError(
                    f"the warm sets did not re-warm in {options.timeout_s:.0f}s: {detail}"
                )
            await asyncio.sleep(_POLL_S)


async def _counters(client: httpx.AsyncClient, source: str) -> Counters | None:
    """The server's token-weighted prefix-cache counters, or None if it has none."""
    if source == "/v1/status":
        status = await _get_json(client, source)
        cache = status.get("cache") if isinstance(status, dict) else None
        if isinstance(cache, dict) and "hit_tokens" in cache and "queried_tokens" in cache:
            return Counters(float(cache["hit_tokens"]), float(cache["queried_tokens"]))
        return None
    if source == "/metrics":
        try:
            response = await client.get(source, timeout=30)
        except httpx.HTTPError:
            return None
        if response.status_code != 200:
            return None
        return parse_prometheus_counters(response.text)
    return None


async def _run_cell(
    client: httpx.AsyncClient,
    model: str,
    prompts: list[BenchPrompt],
    concurrency: int,
    options: BenchOptions,
    progress: Progress,
    cell: tuple[str, int, int],
) -> list[RequestResult]:
    results: list[RequestResult | None] = [None] * len(prompts)
    pending = iter(range(len(prompts)))  # shared by the workers: one event loop, no lock

    async def worker() -> None:
        for index in pending:
            results[index] = await stream_chat(
                client, model, prompts[index], options.max_tokens, cell, index
            )
            progress.advance()

    await asyncio.gather(*(worker() for _ in range(min(concurrency, len(prompts)))))
    return [r for r in results if r is not None]


async def stream_chat(
    client: httpx.AsyncClient,
    model: str,
    prompt: BenchPrompt,
    max_tokens: int,
    cell: tuple[str, int, int],
    index: int,
) -> RequestResult:
    """One streamed chat completion, timed from just before it is sent."""
    body = {
        **prompt.body(),
        "model": model,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    started = time.perf_counter()
    first: float | None = None
    usage: dict[str, Any] | None = None
    finish: str | None = None
    pieces = 0  # chunks with generated text: the token count if no usage comes

    def result(error: str | None = None) -> RequestResult:
        details = (usage or {}).get("prompt_tokens_details") or {}
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        completion = (usage or {}).get("completion_tokens", pieces if first else None)
        return RequestResult(
            *cell,
            index=index,
            ttft_s=None if first is None else first - started,
            e2e_s=time.perf_counter() - started,
            prompt_tokens=_int((usage or {}).get("prompt_tokens")),
            cached_tokens=_int(cached),
            completion_tokens=_int(completion),
            finish_reason=finish,
            error=error,
        )

    try:
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                await response.aread()
                return result(f"HTTP {response.status_code}: {_error_message(response)}")
            done = False
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[len("data:") :].strip()
                if data == "[DONE]":
                    done = True
                    break
                try:
                    chunk = json.loads(data)
                except json.JSONDecodeError:
                    return result(f"bad stream chunk: {data[:120]!r}")
                if not isinstance(chunk, dict):
                    return result(f"bad stream chunk: {data[:120]!r}")
                if chunk.get("error"):
                    return result(f"error in stream: {_error_text(chunk['error'])}")
                if isinstance(chunk.get("usage"), dict):
                    usage = chunk["usage"]
                for choice in chunk.get("choices") or []:
                    delta = choice.get("delta") or {}
                    if any(delta.get(k) for k in ("content", "reasoning_content", "reasoning")) or (
                        delta.get("tool_calls")
                    ):
                        pieces += 1
                        if first is None:
                            first = time.perf_counter()
                    finish = choice.get("finish_reason") or finish
            if finish is None:
                why = "without a finish_reason" if done else "before it finished"
                return result(f"the stream ended {why}")
            return result()
    except httpx.TimeoutException as exc:
        return result(f"timed out: {_describe(exc)}")
    except httpx.HTTPError as exc:
        return result(_describe(exc))


class _Cursor:
    """Hands out a set's prompts in order, across cells: no request repeats an earlier
    one (a repeat could be served whole from the cache). Once the set is used up, the
    last message gets a request number appended to keep it distinct."""

    def __init__(self, prompt_set: PromptSet) -> None:
        self._prompts = prompt_set.prompts
        self._next = 0

    def next(self) -> BenchPrompt:
        n = self._next
        self._next += 1
        prompt = self._prompts[n % len(self._prompts)]
        if n < len(self._prompts):
            return prompt
        *head, last = prompt.messages
        content = last.get("content")
        suffix = f"\n\n(request {n + 1})"
        if isinstance(content, str):
            last = {**last, "content": content + suffix}
        elif isinstance(content, list):
            last = {**last, "content": [*content, {"type": "text", "text": suffix}]}
        return BenchPrompt((*head, last), prompt.tools)


def _row(
    bench: BenchRun,
    prompt_set: str,
    concurrency: int,
    stats: CellStats,
    counters: tuple[float, float] | None,
) -> dict[str, Any]:
    options, server = bench.options, bench.server
    hit, queried = counters if counters is not None else (None, None)
    row = {
        "tag": options.tag,
        "run_id": bench.run_id,
        "started_at": bench.started_at,
        "server_url": server.url,
        "server_software": server.software,
        "model": server.model,
        "prompt_set": prompt_set,
        "concurrency": concurrency,
        "requests": stats.requests,
        "repetitions": options.repetitions,
        "max_tokens": options.max_tokens,
        "cache_policy": options.cache_policy,
        "ok": stats.ok,
        "errors": stats.errors,
        "length_finishes": stats.length_finishes,
        "ttft_p50_ms": _ms(stats.ttft.p50),
        "ttft_p95_ms": _ms(stats.ttft.p95),
        "ttft_mean_ms": _ms(stats.ttft.mean),
        "tpot_p50_ms": _ms(stats.tpot.p50),
        "tpot_p95_ms": _ms(stats.tpot.p95),
        "tpot_mean_ms": _ms(stats.tpot.mean),
        "e2e_p50_ms": _ms(stats.e2e.p50),
        "e2e_p95_ms": _ms(stats.e2e.p95),
        "e2e_mean_ms": _ms(stats.e2e.mean),
        "prompt_tokens_mean": _round(stats.prompt_tokens.mean, 1),
        "cached_tokens_mean": _round(stats.cached_tokens.mean, 1),
        "completion_tokens_mean": _round(stats.completion_tokens.mean, 1),
        "cached_token_share": _round(stats.cached_share, 4),
        "request_throughput_rps": _round(stats.request_throughput, 3),
        "output_tokens_per_s": _round(stats.output_token_throughput, 2),
        "duration_s": _round(stats.duration_s, 3),
        "server_counters": server.counters if counters is not None else "",
        "server_hit_tokens": hit,
        "server_queried_tokens": queried,
        "server_hit_rate": _round(hit / queried, 4) if hit is not None and queried else None,
        "first_error": stats.error_messages[0] if stats.error_messages else "",
    }
    return row


async def _get_json(client: httpx.AsyncClient, path: str) -> Any:
    try:
        response = await client.get(path, timeout=30)
        return response.json() if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None


def _error_message(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text.strip()[:300] or response.reason_phrase
    if isinstance(body, dict) and "error" in body:
        return _error_text(body["error"])
    if isinstance(body, dict) and "detail" in body:
        return str(body["detail"])[:300]
    return json.dumps(body)[:300]


def _error_text(error: Any) -> str:
    if isinstance(error, dict):
        return str(error.get("message") or error)[:300]
    return str(error)[:300]


def _describe(exc: Exception) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) else None


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 2)


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)
