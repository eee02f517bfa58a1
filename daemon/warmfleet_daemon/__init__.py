"""warmfleet daemon: an MLX engine with continuous batching and a prefix cache."""

import os

# transformers (pulled in by mlx-lm for tokenizers) advises at import time that
# PyTorch is missing; mlx-lm never needs PyTorch, so the advice is noise here.
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
