"""mlx-lm's import sets the open-files limit to (2048, 4096) whatever it was; a daemon
serves with the limit it was started with (or as close as an unprivileged process may
get back), so fifty simulated daemons in one process do not run out of sockets."""

from __future__ import annotations

import resource
import subprocess
import sys

CHECK = """
import resource
import warmfleet_daemon
import mlx_lm.utils  # lowers the limit
lowered = resource.getrlimit(resource.RLIMIT_NOFILE)
from warmfleet_daemon.support import open_files
open_files.restore()
print(lowered, resource.getrlimit(resource.RLIMIT_NOFILE))
"""


def limits_after(start: tuple[int, int]) -> tuple[str, str]:
    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, start)

    out = subprocess.run(
        [sys.executable, "-c", CHECK], preexec_fn=limited, capture_output=True, text=True,
        timeout=120, check=True,
    ).stdout.strip()  # fmt: skip
    lowered, restored = out.split(") (")
    return lowered + ")", "(" + restored


def test_a_limit_mlx_lm_lowered_is_put_back() -> None:
    # (This process imported mlx-lm: its hard limit is 4096 at most, as is a child's.)
    lowered, restored = limits_after((4000, 4096))
    assert lowered == "(2048, 4096)"  # mlx-lm's (if it stops, this test says so)
    assert restored == "(4000, 4096)"


def test_a_soft_limit_mlx_lm_raised_stays_raised() -> None:
    lowered, restored = limits_after((1024, 4096))
    assert lowered == restored == "(2048, 4096)"
