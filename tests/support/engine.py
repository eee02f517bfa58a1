"""Helpers shared by the tests (importable: pytest puts tests/ on sys.path)."""

from __future__ import annotations

from warmfleet_daemon.support.blas import ensure_fast_blas

ensure_fast_blas()

from warmfleet_common.prompts import RenderedPrompt  # noqa: E402
from warmfleet_daemon.engine.core import Engine  # noqa: E402
from warmfleet_daemon.engine.requests import Event, GenerationRequest  # noqa: E402
from warmfleet_daemon.engine.sampling import SamplingParams  # noqa: E402
from warmfleet_daemon.models.loader import LoadedModel, load_model  # noqa: E402

_models: dict[str, LoadedModel] = {}


def model(spec: str) -> LoadedModel:
    """Load once per test session."""
    if spec not in _models:
        _models[spec] = load_model(spec)
    return _models[spec]


def greedy(max_tokens: int = 12, **kw: object) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, **kw)  # type: ignore[arg-type]


def run(engine: Engine, *requests: GenerationRequest) -> list[list[Event]]:
    """Submit, step the engine until idle, return each request's events."""
    events: list[list[Event]] = [[] for _ in requests]
    for i, req in enumerate(requests):
        engine.submit(req, events[i].append)
    engine.run_until_idle()
    assert all(evs and evs[-1].finish_reason for evs in events)
    return events


def tokens_of(events: list[Event]) -> list[int]:
    return [t for e in events for t in e.token_ids]


def request(
    tokens: list[int] | tuple[int, ...], cuts: tuple[int, ...] = (), **kw: object
) -> GenerationRequest:
    sampling = kw.pop("sampling", None) or greedy()
    return GenerationRequest(RenderedPrompt(tuple(tokens), cuts), sampling, **kw)  # type: ignore[arg-type]
