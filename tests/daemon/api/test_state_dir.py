"""--state-dir under bad conditions (in process, tiny model): an unreadable file (or a
FIFO in its place), an unreadable set among good ones, a disk that refuses writes,
names the routes refuse, fields warm-up does not use, and a file that would grow
without bound. The daemon always starts, loses nothing it could read, and memory and
disk always agree."""

from __future__ import annotations

import errno
import json
import logging
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from support.engine import model
from warmfleet_daemon.api.app import create_app
from warmfleet_daemon.engine.core import Engine
from warmfleet_daemon.engine.requests import EngineConfig
from warmfleet_daemon.settings import DaemonSettings
from warmfleet_daemon.warming.state_store import FILE_NAME, StateStore

SYSTEM = {"role": "system", "content": "You are Pager, the on-call agent. Be brief. " * 6}


def spec(generation: int = 1, name: str = "pager") -> dict[str, Any]:
    return {"generation": generation, "prompts": [{"name": name, "messages": [SYSTEM]}]}


def saved(namespace: str, name: str, body: Any) -> dict[str, Any]:
    return {"namespace": namespace, "name": name, "spec": body}


def write_state(directory: Path, sets: list[dict[str, Any]]) -> None:
    (directory / FILE_NAME).write_text(json.dumps({"version": 1, "sets": sets}))


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Any]:
    clients: list[TestClient] = []

    def make(**settings: Any) -> TestClient:
        engine = Engine(
            model("tiny-random"), EngineConfig(block_size=32, cache_budget_bytes=64 << 20)
        )
        app = create_app(
            DaemonSettings(model="tiny-random", state_dir=str(tmp_path), **settings), engine=engine
        )
        client = TestClient(app)
        client.__enter__()
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.__exit__(None, None, None)


def names(client: TestClient) -> list[str]:
    return sorted(
        f"{s['namespace']}/{s['name']}" for s in client.get("/v1/warm-sets").json()["sets"]
    )


def aside(directory: Path, pattern: str) -> list[Path]:
    return sorted(directory.glob(pattern))


def test_a_deeply_nested_state_file_is_moved_aside_and_the_daemon_serves(
    start: Any, tmp_path: Path
) -> None:
    (tmp_path / FILE_NAME).write_text("[" * 200_000)
    client = start()
    assert client.get("/readyz").status_code == 200
    assert client.get("/v1/models").status_code == 200
    assert names(client) == []
    kept = aside(tmp_path, f"{FILE_NAME}.unreadable-*")
    assert len(kept) == 1 and kept[0].read_text() == "[" * 200_000
    assert client.put("/v1/warm-sets/ops/pager", json=spec()).status_code == 202


@pytest.mark.timeout(60)  # reading a FIFO used to block until a writer came: forever
def test_a_state_file_that_is_a_fifo_is_moved_aside_unread(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    os.mkfifo(tmp_path / FILE_NAME)
    with caplog.at_level(logging.ERROR):
        assert StateStore(tmp_path).load() == {}
    [kept] = aside(tmp_path, f"{FILE_NAME}.unreadable-*")
    assert stat.S_ISFIFO(kept.stat().st_mode) and not (tmp_path / FILE_NAME).exists()
    [line] = [r.getMessage() for r in caplog.records]
    assert "is a FIFO, not a regular file" in line


def test_a_state_file_over_the_bound_is_moved_aside_unread(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write_state(tmp_path, [saved("ops", "pager", spec())])
    size = (tmp_path / FILE_NAME).stat().st_size
    with caplog.at_level(logging.ERROR):
        assert StateStore(tmp_path, max_bytes=size - 1).load() == {}
    assert len(aside(tmp_path, f"{FILE_NAME}.unreadable-*")) == 1
    assert f"has {size} bytes, more than the {size - 1} read" in caplog.records[0].getMessage()


def test_one_bad_set_does_not_drop_the_others(start: Any, tmp_path: Path) -> None:
    bad = spec(name="no spaces allowed")
    write_state(
        tmp_path,
        [saved("ops", "pager", spec()), saved("ops", "broken", bad), saved("dev", "pager", spec())],
    )
    client = start()
    assert names(client) == ["dev/pager", "ops/pager"]
    [rejected] = aside(tmp_path, "warm-sets.rejected-*.json")
    kept = json.loads(rejected.read_text())["sets"]
    assert [k["item"]["name"] for k in kept] == ["broken"] and kept[0]["reason"]
    # The next save keeps the good sets; the bad one stays in its own file.
    assert client.put("/v1/warm-sets/ops/other", json=spec()).status_code == 202
    on_disk = json.loads((tmp_path / FILE_NAME).read_text())["sets"]
    assert sorted(s["name"] for s in on_disk) == ["other", "pager", "pager"]
    assert rejected.exists()


def test_names_the_routes_refuse_are_not_restored(start: Any, tmp_path: Path) -> None:
    write_state(
        tmp_path,
        [
            saved("Bad_NS", "pager", spec()),
            saved("ops", "../../etc", spec()),
            saved("ops", "ok", spec()),
        ],
    )
    client = start()
    assert names(client) == ["ops/ok"]
    [rejected] = aside(tmp_path, "warm-sets.rejected-*.json")
    assert len(json.loads(rejected.read_text())["sets"]) == 2


def test_a_failed_save_changes_nothing(
    start: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = start()
    assert client.put("/v1/warm-sets/ops/pager", json=spec(1)).status_code == 202
    before_disk = (tmp_path / FILE_NAME).read_text()
    before = client.get("/v1/warm-sets/ops/pager").json()

    def read_only(self: StateStore, sets: object) -> None:
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(StateStore, "save", read_only)
    changed = spec(2)
    changed["prompts"][0]["messages"] = [{"role": "system", "content": "Something else."}]
    for r in (
        client.put("/v1/warm-sets/ops/pager", json=changed),
        client.put("/v1/warm-sets/ops/new", json=spec()),
        client.delete("/v1/warm-sets/ops/pager"),
    ):
        assert r.status_code == 503, r.text
        assert "cannot be saved" in r.json()["error"]["message"]
    assert names(client) == ["ops/pager"]
    now = client.get("/v1/warm-sets/ops/pager").json()
    assert (now["generation"], now["content_hash"]) == (
        before["generation"],
        before["content_hash"],
    )
    assert (tmp_path / FILE_NAME).read_text() == before_disk


def test_unknown_message_fields_are_refused(start: Any, tmp_path: Path) -> None:
    client = start()
    body = spec()
    body["prompts"][0]["messages"] = [{**SYSTEM, "padding": "x" * 10_000}]
    r = client.put("/v1/warm-sets/ops/pager", json=body)
    assert r.status_code == 400 and "padding" in r.json()["error"]["message"]
    assert names(client) == [] and not (tmp_path / FILE_NAME).exists()


def test_the_state_file_is_bounded(start: Any, tmp_path: Path) -> None:
    client = start(max_state_mb=1)
    system = {"role": "system", "content": "word " * 5_000}  # ~25 KB, within the context
    prompts = [{"name": f"p{i}", "messages": [system]} for i in range(45)]
    r = client.put("/v1/warm-sets/ops/huge", json={"prompts": prompts, "pin": False})
    assert r.status_code == 413, r.text
    assert "limit is 1.0 MB" in r.json()["error"]["message"]
    assert names(client) == [] and not (tmp_path / FILE_NAME).exists()


def test_restored_sets_warm(start: Any, tmp_path: Path) -> None:
    write_state(tmp_path, [saved("ops", "pager", spec())])
    client = start()
    deadline = time.monotonic() + 60
    while client.get("/readyz", params={"warm": 1}).status_code != 200:
        assert time.monotonic() < deadline
        time.sleep(0.05)
