"""OpenBLAS is loaded with its idle workers told to sleep soon, unless the user says
otherwise (the variable is read when OpenBLAS loads, so it is set just before)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from warmfleet_daemon.support import blas

PROBE = (
    "import os; from warmfleet_daemon.support.blas import ensure_fast_blas; "
    "info = ensure_fast_blas(); print(info.fast, os.environ.get('OPENBLAS_THREAD_TIMEOUT'))"
)


def probe(env: dict[str, str]) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True
    )
    return out.stdout.split()


@pytest.mark.skipif(sys.platform != "linux", reason="OpenBLAS is loaded on Linux only")
def test_the_thread_timeout_is_set_before_openblas_loads_and_a_set_one_wins() -> None:
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
    fast, timeout = probe(env)
    if fast != "True":
        pytest.skip("no OpenBLAS on this machine")
    assert timeout == blas.THREAD_TIMEOUT
    assert probe({**env, "OPENBLAS_THREAD_TIMEOUT": "20"})[1] == "20"
