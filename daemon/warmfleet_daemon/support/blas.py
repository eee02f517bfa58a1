"""Load Debian's OpenBLAS ahead of mlx on Linux CPUs.

The mlx-cpu wheel links a bundled reference BLAS that runs float32 matmul at about
8 GFLOP/s. mlx resolves `cblas_sgemm` through the global symbol scope, so an OpenBLAS
loaded with RTLD_GLOBAL *before* `import mlx` takes over (about 30x faster here).
Loading it after mlx has been imported has no effect, hence this module imports
nothing heavy and must run first (the CLI and the test conftest call it).
"""

from __future__ import annotations

import ctypes
import glob
import logging
import os
import platform
import sys
from dataclasses import dataclass

log = logging.getLogger(__name__)

# OpenBLAS's idle workers spin for 2^N cycles before they sleep (default N=28, ~0.1 s):
# between the matmuls of a decode step they kept a core from the threads running the
# element-wise ops and the HTTP side (c=8 decode over HTTP: 95-118 tok/s by round with
# 28, 104-124 with 16, docs/PERFORMANCE.md). Read when OpenBLAS loads; a set value wins.
THREAD_TIMEOUT = "16"

# OpenBLAS kernels for x86_64 CPUs with AVX2 and FMA. The decode path's batch invariance
# (a row's logits the same alone or batched, engine/decode_forward.py) holds for these
# kernels and not for SkylakeX's, and OpenBLAS 0.3.21 takes CPUs newer than it knows
# (Emerald Rapids) for a Prescott, whose kernels are 3-4x slower: one choice on every
# x86_64 node, the same results fleet-wide. A set OPENBLAS_CORETYPE wins.
X86_CORETYPE = "Haswell"

_CANDIDATES = (
    "/usr/lib/*-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib/*-linux-gnu/openblas-openmp/libopenblas.so.0",
    "/usr/lib/*-linux-gnu/libopenblas.so.0",
    "/usr/lib64/libopenblas*.so.0",
)


@dataclass(frozen=True)
class BlasInfo:
    name: str  # "OpenBLAS 0.3.21 ...", "Accelerate/Metal", "bundled reference BLAS"
    path: str | None
    fast: bool


_loaded: BlasInfo | None = None


def ensure_fast_blas() -> BlasInfo:
    """Preload OpenBLAS if this is Linux and mlx is not imported yet. Idempotent."""
    global _loaded
    if _loaded is not None:
        return _loaded
    if sys.platform == "darwin":
        _loaded = BlasInfo("Accelerate (macOS)", None, True)
        return _loaded
    if "mlx.core" in sys.modules:
        _loaded = _describe_already_imported()
        return _loaded
    override = os.environ.get("WARMFLEET_BLAS", "")
    if override == "bundled":
        _loaded = BlasInfo("bundled reference BLAS (WARMFLEET_BLAS=bundled)", None, False)
        return _loaded
    paths = [override] if override else [p for pat in _CANDIDATES for p in sorted(glob.glob(pat))]
    os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", THREAD_TIMEOUT)
    if platform.machine() in ("x86_64", "AMD64") and _cpu_has("avx2", "fma"):
        os.environ.setdefault("OPENBLAS_CORETYPE", X86_CORETYPE)
    for path in paths:
        try:
            lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        except OSError:
            continue
        _loaded = BlasInfo(_openblas_config(lib) or "OpenBLAS", path, True)
        return _loaded
    _loaded = BlasInfo("bundled reference BLAS", None, False)
    return _loaded


def log_blas(info: BlasInfo, *, on_gpu: bool) -> None:
    """Say which BLAS runs the matmuls; warn loudly when it is the slow one."""
    if on_gpu:
        log.info("MLX device: Metal GPU (BLAS not used for model matmuls)")
    elif info.fast:
        log.info("MLX device: CPU, BLAS: %s%s", info.name, f" ({info.path})" if info.path else "")
    else:
        log.warning(
            "MLX device: CPU with only the %s (about 30x slower float32 matmul). "
            "Install Debian/Ubuntu's libopenblas0-pthread (apt-get install libopenblas0-pthread) "
            "and restart; warmfleet loads it automatically.",
            info.name,
        )


def _openblas_config(lib: ctypes.CDLL) -> str | None:
    try:
        config, corename = lib.openblas_get_config, lib.openblas_get_corename
    except AttributeError:
        return None
    config.restype = corename.restype = ctypes.c_char_p
    raw, core = config(), corename()
    if not raw:
        return None
    name = raw.decode(errors="replace").split(" NO_")[0]
    return f"{name}, {core.decode(errors='replace')} kernels" if core else name


def _cpu_has(*flags: str) -> bool:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(flags) <= set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return False


def _describe_already_imported() -> BlasInfo:
    # Too late to preload: report what the process already has.
    try:
        lib = ctypes.CDLL(None)
        config = _openblas_config(lib)
    except OSError:
        config = None
    if config:
        return BlasInfo(config, None, True)
    return BlasInfo(
        f"bundled reference BLAS (mlx was imported before warmfleet could load OpenBLAS"
        f" on {platform.machine()})",
        None,
        False,
    )
