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


CORE_PROBE = (
    "from warmfleet_daemon.support.blas import ensure_fast_blas; print(ensure_fast_blas().name)"
)


@pytest.mark.skipif(sys.platform != "linux", reason="OpenBLAS is loaded on Linux only")
def test_x86_cpus_with_avx2_get_the_kernels_the_decode_path_is_invariant_on() -> None:
    """Whatever the CPU (OpenBLAS 0.3.21 takes an Emerald Rapids for a Prescott), an
    AVX2 x86_64 node runs the Haswell kernels, and a set OPENBLAS_CORETYPE wins."""
    if not blas._cpu_has("avx2", "fma"):
        pytest.skip("no AVX2 and FMA on this CPU")
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}

    def name(extra: dict[str, str]) -> str:
        run = subprocess.run(
            [sys.executable, "-c", CORE_PROBE], env={**env, **extra}, capture_output=True,
            text=True, check=True,
        )  # fmt: skip
        return run.stdout.strip()

    chosen = name({})
    if not chosen.startswith("OpenBLAS"):
        pytest.skip("no OpenBLAS on this machine")
    assert chosen.endswith(f"{blas.X86_CORETYPE} kernels")
    assert name({"OPENBLAS_CORETYPE": "Prescott"}).endswith("Prescott kernels")
