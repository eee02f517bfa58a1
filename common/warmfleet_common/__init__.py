"""warmfleet's shared core: what every component needs and no component owns.

The wire models of every route one component calls on another, chunking and block keys,
the cache layout, prompt rendering, OpenTelemetry set-up, the CRD names and one
Kubernetes client set-up. It imports no component, and never mlx, FastAPI or kopf
(import-linter contracts in pyproject.toml say so)."""

import os

# transformers (the router's layout tokenizer, mlx-lm's tokenizers) advises at import time
# that PyTorch is missing; warmfleet never needs PyTorch, so the advice is noise here.
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

__version__ = "0.1.0"
