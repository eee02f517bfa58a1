# The two commands: `make run` (the local fleet on the embedded model) and `make test`.
VENV := .venv
STAMP := $(VENV)/.warmfleet-installed
HOST ?= 127.0.0.1
PORT ?= 8000
WARM_PROMPTS ?= examples/daemon/warm-prompts.yaml
NODES ?= 2
# Coding agents' first requests are 9-16k tokens (Codex, Claude Code, Qwen Code) and their
# sessions grow: 32k served, beyond the embedded model's own 8,192 (a warning is logged).
MAX_CONTEXT ?= 32768
# Past its training context the 135M model seldom ends an answer, and Codex asks for no
# limit: every response is bounded, so each agent gets its answer in time.
MAX_OUTPUT_TOKENS ?= 256
STATE_DIR ?= .warmfleet

.PHONY: run test setup lint bench clean

# NODES daemons on PORT+1.., the operator in local mode, the router on PORT; each daemon keeps
# its warm sets and its disk tier in STATE_DIR/node-N, so a restart comes back warm.
run: $(STAMP)
	$(VENV)/bin/warmfleet up --nodes $(NODES) --model default --host $(HOST) --port $(PORT) \
		--max-context $(MAX_CONTEXT) --max-output-tokens $(MAX_OUTPUT_TOKENS) --state-dir $(STATE_DIR) \
		$(if $(WARM_PROMPTS),--warm $(WARM_PROMPTS))

test: $(STAMP)
	./scripts/setup.sh --test-tools
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet
	$(VENV)/bin/pytest -n 2 --dist loadfile

setup: $(STAMP)

$(STAMP): pyproject.toml scripts/setup.sh
	./scripts/setup.sh

bench: $(STAMP)
	$(VENV)/bin/python bench/engine_vs_mlx_lm.py
	$(VENV)/bin/python bench/decode_c8.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
