"""One log format for every `warmfleet` command that sets up logging itself, and the
access log without the polls: health, readiness, status, cache snapshot, event and
warm-set reads come every few seconds from the router and the operator, so they would
fill an idle fleet's terminal (they stay counted in the metrics; `--access-log` shows
them)."""

from __future__ import annotations

import logging

# The routes other components poll (GET only: a PUT of a warm set is a change, shown).
POLLED_PATHS = (
    "/healthz",
    "/readyz",
    "/metrics",
    "/v1/status",
    "/v1/models",
    "/v1/router/status",
    "/v1/cache/snapshot",
    "/v1/cache/layout",
    "/v1/cache/events",
    "/v1/warm-sets",
)


def setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


class WithoutPolls(logging.Filter):
    """Drops uvicorn's access-log lines of GETs on `POLLED_PATHS` (and below them)."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if not isinstance(args, tuple) or len(args) < 3:
            return True
        method, path = args[1], str(args[2]).split("?", 1)[0]
        polled = any(path == p or path.startswith(p + "/") for p in POLLED_PATHS)
        return not (method == "GET" and polled)


def quiet_access_log(show_polls: bool) -> None:
    """uvicorn's access log, without the polls unless `show_polls`."""
    access = logging.getLogger("uvicorn.access")
    for existing in [f for f in access.filters if isinstance(f, WithoutPolls)]:
        access.removeFilter(existing)
    if not show_polls:
        access.addFilter(WithoutPolls())
