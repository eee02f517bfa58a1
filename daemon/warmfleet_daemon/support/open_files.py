"""The open-files limit as the daemon was started with, kept from mlx-lm's import.

`import mlx_lm` sets RLIMIT_NOFILE to (2048, 4096) whatever it was (its utils.py, for
models of many files; ml-explore/mlx-lm#1589): a soft limit of 2048 for a process that
serves fifty simulated daemons' sockets (a hundred-node `warmfleet up --engine sim` ran
out of them and never got warm), and a hard limit that an unprivileged process cannot
raise again. The package's `__init__` records the limits before anything imports mlx-lm;
`restore()`, once the model code is imported, puts them back as far as the process may.
"""

from __future__ import annotations

import logging

try:
    import resource
except ImportError:  # not a POSIX system: no such limit
    resource = None  # type: ignore[assignment]

log = logging.getLogger(__name__)
_restored = False

AT_START: tuple[int, int] | None = (
    resource.getrlimit(resource.RLIMIT_NOFILE) if resource is not None else None
)


def restore() -> None:
    """Undo what mlx-lm lowered: the soft limit back to at least what it was at start
    (what mlx-lm raised stays raised), the hard one back to what it was, or, when the
    process may not raise it again (unprivileged), the soft one up to the hard one left."""
    global _restored
    if resource is None or AT_START is None or _restored:
        return
    _restored = True  # once a process (fifty simulated daemons restore it in turn)
    kind = resource.RLIMIT_NOFILE
    now = resource.getrlimit(kind)
    wanted = (_larger(AT_START[0], now[0]), _larger(AT_START[1], now[1]))
    if wanted == now:
        return
    try:
        resource.setrlimit(kind, wanted)
        return
    except (ValueError, OSError):  # the hard limit cannot go up again
        pass
    soft = wanted[0] if _larger(wanted[0], now[1]) == now[1] else now[1]
    try:
        resource.setrlimit(kind, (soft, now[1]))
    except (ValueError, OSError) as exc:
        log.warning("open files limit left at %s (mlx-lm lowered it): %s", now, exc)
        return
    log.warning(
        "mlx-lm lowered the open files limit from %s to %s on import, and it cannot be "
        "raised again without privilege: serving with %s",
        AT_START, now, resource.getrlimit(kind),
    )  # fmt: skip


def _larger(a: int, b: int) -> int:
    infinity = resource.RLIM_INFINITY
    return infinity if infinity in (a, b) else max(a, b)
