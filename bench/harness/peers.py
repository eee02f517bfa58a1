"""The servers warmfleet is compared with, started as the benchmarks start them:
mlx_lm.server and vllm-mlx on the embedded model's weights (`warmfleet convert`), with
the BLAS warmfleet loads; the options of the side-by-side benchmarks."""

from __future__ import annotations

import argparse
import glob
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from harness.processes import Proc, free_port, launch
from harness.warmfleet import cli, serve
from warmfleet_daemon.support.blas import THREAD_TIMEOUT

VENV_BIN = Path(sys.executable).parent
# vllm-mlx lives in its own virtualenv (its dependencies pin other versions of mlx-lm):
#     python3.11 -m venv ~/.cache/peers/vllm-mlx
#     ~/.cache/peers/vllm-mlx/bin/pip install vllm-mlx==0.6.0 'mlx[cpu]'
DEFAULT_VLLM_MLX = Path.home() / ".cache/peers/vllm-mlx/bin/vllm-mlx"


def openblas() -> str | None:
    found = sorted(glob.glob("/usr/lib/*-linux-gnu/openblas-pthread/libopenblas.so.0"))
    return found[0] if found else None


def peer_env() -> dict[str, str]:
    """A peer's environment: this one, with the BLAS warmfleet loads (LD_PRELOAD) and
    warmfleet's OPENBLAS_THREAD_TIMEOUT."""
    env = {**os.environ}
    blas = openblas()
    if blas:
        env["LD_PRELOAD"] = blas
        env.setdefault("OPENBLAS_THREAD_TIMEOUT", THREAD_TIMEOUT)  # as warmfleet sets it
    return env


def vllm_mlx_env(home: Path) -> dict[str, str]:
    """vllm-mlx's environment: the BLAS warmfleet loads, and a HOME of its own, because
    it saves its prefix cache under ~/.cache/vllm-mlx at exit and loads it at start (an
    earlier run's prompts would be warm in this one)."""
    home.mkdir(parents=True, exist_ok=True)
    return {**peer_env(), "HOME": str(home)}


def mlx_lm_server(model_dir: str, *options: str, **launching: Any) -> Proc:
    """mlx_lm.server on the converted weights, ready once /health says 200."""
    port = free_port()
    cmd = [str(VENV_BIN / "mlx_lm.server"), "--model", model_dir, "--port", str(port), *options]
    cmd += ["--log-level", "WARNING"]
    return launch(cmd, port, "/health", model=model_dir, env=peer_env(), **launching)


def vllm_mlx(binary: Path, model_dir: str, *options: str, home: Path, **launching: Any) -> Proc:
    """`vllm-mlx serve DIR --continuous-batching OPTIONS` (as its README serves several
    clients), with a HOME of its own; ready once /health says 200."""
    port = free_port()
    cmd = [str(binary), "serve", model_dir, "--port", str(port), "--continuous-batching"]
    cmd += options
    env = vllm_mlx_env(home)
    return launch(cmd, port, "/health", name="vllm-mlx", model=model_dir, env=env, **launching)


def prime(server: Proc) -> None:
    """One tiny request (not shared with any prompt): what a first request loads, loaded."""
    hi = {"model": server.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    httpx.post(f"{server.url}/v1/chat/completions", json=hi, timeout=60).raise_for_status()


def server(kind: str, model_dir: str, extra: Sequence[str] = ()) -> Proc:
    """A started server, warmfleet or mlx_lm.server, primed; `extra`: more `warmfleet
    serve` options."""
    if kind == "warmfleet":
        started = serve(*extra, "--log-level", "warning")
    else:
        started = mlx_lm_server(model_dir)
    try:
        prime(started)
    except BaseException:
        started.stop()
        raise
    return started


def arguments(doc: str | None) -> argparse.ArgumentParser:
    """The options both side-by-side benchmarks take."""
    ap = argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--system-tokens", type=int, default=1500)
    ap.add_argument("--model-dir", default=None, help="converted model (default: a temp dir)")
    return ap


def prepare(model_dir: str | None) -> tuple[Any, str]:
    """The embedded model's tokenizer, and the model converted for the peers."""
    from warmfleet_daemon.models.loader import load_gguf_tokenizer_only

    model_dir = model_dir or str(Path(tempfile.gettempdir()) / "warmfleet-bench-smollm2")
    if not Path(model_dir, "config.json").exists():
        subprocess.run(cli("convert", "default", model_dir), check=True)
    return load_gguf_tokenizer_only(), model_dir
