# The two commands: `make run` (serve the embedded model) and `make test`.
VENV := .venv
STAMP := $(VENV)/.warmfleet-installed
HOST ?= 127.0.0.1
PORT ?= 8000
WARM_PROMPTS ?= examples/daemon/warm-prompts.yaml

.PHONY: run test setup lint bench clean

run: $(STAMP)
	$(VENV)/bin/warmfleet serve --model default --host $(HOST) --port $(PORT) \
		$(if $(WARM_PROMPTS),--warm-prompts $(WARM_PROMPTS))

test: $(STAMP)
	./scripts/setup.sh --test-tools
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
	$(VENV)/bin/pytest

setup: $(STAMP)

$(STAMP): pyproject.toml scripts/setup.sh
	./scripts/setup.sh

bench: $(STAMP)
	$(VENV)/bin/python bench/engine_vs_mlx_lm.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
