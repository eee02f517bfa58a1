"""A real router in front of two real tiny-random daemons serving different model names
(`--served-model-name coder` and `writer`): each request goes to the daemon serving
its model, the router's /v1/models is the union, and a model neither serves is the
daemons' own 404 `model_not_found`, answered by the router."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import openai
import pytest

from support.processes import Daemon, start_daemon, start_router


@pytest.fixture(scope="module")
def fleet() -> Iterator[dict[str, Daemon]]:
    daemons = {
        name: start_daemon("--model", "tiny-random", "--served-model-name", name)
        for name in ("coder", "writer")
    }
    router = start_router(*(a for d in daemons.values() for a in ("--backend", d.url)))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # both backends ready, their models read
        backends = httpx.get(f"{router.url}/v1/router/status", timeout=5).json()["backends"]
        if all(b["models"] for b in backends) and len(backends) == 2:
            break
        time.sleep(0.1)
    yield {**daemons, "router": router}
    router.stop()
    for d in daemons.values():
        d.stop()


def test_requests_go_to_the_daemon_serving_their_model(fleet: dict[str, Daemon]) -> None:
    client = openai.OpenAI(base_url=f"{fleet['router'].url}/v1", api_key="unused", max_retries=0)
    assert sorted(m.id for m in client.models.list().data) == ["coder", "writer"]
    for i in range(3):
        for model in ("coder", "writer"):
            raw = client.chat.completions.with_raw_response.create(
                model=model,
                messages=[{"role": "user", "content": f"question {i} for {model}"}],
                max_tokens=2,
                temperature=0,
            )
            assert raw.headers["x-warmfleet-backend"] == fleet[model].url.removeprefix("http://")
            assert raw.parse().model == model

    with pytest.raises(openai.NotFoundError) as refused:
        client.chat.completions.create(
            model="reviewer", messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
    assert refused.value.code == "model_not_found"
    assert refused.value.param == "model"
    assert "`reviewer` does not exist" in refused.value.message
