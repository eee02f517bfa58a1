"""`warmfleet serve` logs each request it answers but not the polls other components
make every few seconds (health, status, cache, warm sets), unless `--access-log`."""

from __future__ import annotations

import httpx

from support.processes import start_daemon


def test_a_daemon_logs_requests_but_not_polls_unless_asked() -> None:
    for extra, polls_logged in (((), False), (("--access-log",), True)):
        daemon = start_daemon("--model", "tiny-random", "--log-level", "info", *extra)
        try:
            for _ in range(3):
                httpx.get(f"{daemon.url}/v1/status", timeout=10)
            httpx.post(
                f"{daemon.url}/v1/chat/completions",
                json={
                    "model": "tiny-random",
                    "max_tokens": 1,
                    "messages": [{"role": "user", "content": "hi"}],
                },
                timeout=60,
            )
        finally:
            daemon.stop()
        log = daemon.log()
        assert '"POST /v1/chat/completions HTTP/1.1" 200' in log, log
        assert ('"GET /v1/status HTTP/1.1" 200' in log) is polls_logged, log
        assert ('"GET /readyz HTTP/1.1"' in log) is polls_logged, log  # the start's own wait
