"""/v1/status, /metrics, /healthz and /readyz answer while the cache diagnostics
analyze a full window of long, diverging prompts and 8 clients stream: the status
route never waits for the analysis (here it is held until the end of the test)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator

import httpx
import pytest

from support.engine import model
from support.processes import serving
from warmfleet_common.prompts import RenderedPrompt
from warmfleet_daemon.api.app import create_app
from warmfleet_daemon.engine.core import Engine
from warmfleet_daemon.engine.requests import EngineConfig, Event, GenerationRequest, Usage
from warmfleet_daemon.engine.sampling import SamplingParams
from warmfleet_daemon.runtime import diagnostics as cache_diagnostics
from warmfleet_daemon.settings import DaemonSettings

TOKEN = "status-token"


@pytest.fixture
def held_analysis(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """The diagnostics analysis blocks until the test releases it; yields 'entered'."""
    entered, release = threading.Event(), threading.Event()
    real = cache_diagnostics.analyze

    def held(*args: object, **kwargs: object) -> object:
        entered.set()
        release.wait(120)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(cache_diagnostics, "analyze", held)
    yield entered
    release.set()


def fill_window(diagnostics: cache_diagnostics.CacheDiagnostics) -> None:
    """A full window of ~1,500-token prompts that differ after a few tokens, all misses."""
    for n in range(cache_diagnostics.WINDOW):
        tokens = (1, 2, 3, n + 10, *range(100 + n, 1600 + n))
        request = GenerationRequest(RenderedPrompt(tokens, (len(tokens) - 8,)), SamplingParams(4))
        diagnostics.observe(request, Event("", finish_reason="stop", usage=Usage(len(tokens), 4)))


def stream(url: str, out: list[str]) -> None:
    body = {
        "model": "tiny-random",
        "stream": True,
        "max_tokens": 96,
        "ignore_eos": True,
        "temperature": 0,
        "messages": [{"role": "user", "content": "Tell me about prefix caches."}],
    }
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=120) as r:
        out.extend(line for line in r.iter_lines() if line)


def test_status_answers_while_the_analysis_runs_and_clients_stream(
    held_analysis: threading.Event,
) -> None:
    engine = Engine(model("tiny-random"), EngineConfig(block_size=32, cache_budget_bytes=64 << 20))
    app = create_app(DaemonSettings(model="tiny-random", admin_token=TOKEN), engine=engine)
    with serving(app) as url:
        fill_window(app.state.daemon.ready.diagnostics)
        # Old code analyzed inside the status call: let one start it either way.
        threading.Thread(target=lambda: httpx.get(f"{url}/v1/status", timeout=60)).start()
        assert held_analysis.wait(30), "the analysis never started"

        outputs: list[list[str]] = [[] for _ in range(8)]
        clients = [threading.Thread(target=stream, args=(url, out)) for out in outputs]
        for c in clients:
            c.start()
        answers: list[int] = []

        def probe(path: str) -> None:
            answers.append(httpx.get(f"{url}{path}", timeout=5).status_code)

        probes = [
            threading.Thread(target=probe, args=(path,))
            for _ in range(12)
            for path in ("/v1/status", "/metrics", "/healthz", "/readyz")
        ]
        for p in probes:
            p.start()
        for p in probes:
            p.join(timeout=30)
        assert answers == [200] * len(probes)

        status = httpx.get(f"{url}/v1/status", timeout=5).json()
        assert status["diagnostics"]["requests"] == cache_diagnostics.WINDOW
        assert status["diagnostics"]["misses"] == cache_diagnostics.WINDOW
        for c in clients:
            c.join(timeout=120)
        assert all(out and out[-1] == "data: [DONE]" for out in outputs)
        assert all("error" not in json.loads(line[6:]) for out in outputs for line in out[:-1])
