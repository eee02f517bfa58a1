"""The simulated daemon's "model": the profile's name and context, and the embedded
model's tokenizer and chat template (prompts are tokenized and rendered for real, so
block keys, matches and token counts are real; a profile's model has its own tokenizer,
whose counts differ by some percent: the only tokenizer a daemon has offline)."""

from __future__ import annotations

import threading
from typing import Any

from warmfleet_common.perf_profile import PerfProfile
from warmfleet_common.prompts import PromptBuilder
from warmfleet_daemon.models.loader import LoadedModel, load_gguf_tokenizer_only


def simulated_model(profile: PerfProfile) -> LoadedModel:
    no_weights: Any = None
    return LoadedModel(
        no_weights,
        _shared_tokenizer(),
        profile.model,
        f"simulated: profile {profile.name}",
        profile.context_length,
        on_gpu=False,
    )


def shared_prompt_builder() -> PromptBuilder:
    """The prompt builder every simulated daemon of the process uses (thread-safe: its
    memo of encoded pieces is shared too)."""
    return _shared()[1]


def vocab_size() -> int:
    return _shared()[2]


_shared_parts: tuple[Any, PromptBuilder, int] | None = None
_lock = threading.Lock()


def _shared_tokenizer() -> Any:
    return _shared()[0]


def _shared() -> tuple[Any, PromptBuilder, int]:
    # One tokenizer for every simulated daemon of the process (a hundred load at once):
    # encoding is thread-safe, and each sequence takes a detokenizer of its own.
    global _shared_parts
    with _lock:
        if _shared_parts is None:
            tokenizer = load_gguf_tokenizer_only()
            _shared_parts = (tokenizer, PromptBuilder(tokenizer), len(tokenizer.vocab))
        return _shared_parts
