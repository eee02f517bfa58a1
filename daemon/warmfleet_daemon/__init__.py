"""warmfleet daemon: an MLX engine with continuous batching and a prefix cache."""

import os

# transformers (pulled in by mlx-lm for tokenizers) advises at import time that
# PyTorch is missing; mlx-lm never needs PyTorch, so the advice is noise here.
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

# Before anything imports mlx-lm, which lowers the open-files limit (support/open_files).
from warmfleet_daemon.support import open_files as _open_files  # noqa: F401
