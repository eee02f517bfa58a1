"""The simulated daemon's "model": the profile's name and context, and the embedded
model's tokenizer and chat template (prompts are tokenized and rendered for real, so
block keys, matches and token counts are real; a profile's model has its own tokenizer,
whose counts differ by some percent: the only tokenizer a daemon has offline)."""

from __future__ import annotations

from typing import Any

from warmfleet_common.perf_profile import PerfProfile
from warmfleet_daemon.models.loader import LoadedModel, load_gguf_tokenizer_only


def simulated_model(profile: PerfProfile) -> LoadedModel:
    no_weights: Any = None
    return LoadedModel(
        no_weights,
        load_gguf_tokenizer_only(),
        profile.model,
        f"simulated: profile {profile.name}",
        profile.context_length,
        on_gpu=False,
    )
