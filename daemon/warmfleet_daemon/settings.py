"""Daemon settings: flags of `warmfleet serve`, or WARMFLEET_* environment variables."""

from __future__ import annotations

import os
import re
import sys
from typing import Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from warmfleet_common.perf_profile import builtin_profiles, load_profile
from warmfleet_common.tls import TlsOptions

MiB = 1 << 20

ENGINE_PATH_ENV = "WARMFLEET_ENGINE_PATH"
ENGINE_PATHS = ("auto", "metal")


def engine_path() -> str:
    """WARMFLEET_ENGINE_PATH: `auto` (the Mac code path on a Metal GPU, the CPU path
    elsewhere) or `metal` (the Mac code path on any device, even the CPU: quantized and
    half-precision weights kept, per-sequence mx.fast attention, 512-token blocks; the
    tests run both paths on Linux with it)."""
    value = os.environ.get(ENGINE_PATH_ENV, "").strip().lower() or "auto"
    if value not in ENGINE_PATHS:
        raise ValueError(f"{ENGINE_PATH_ENV}={value!r}: expected one of {', '.join(ENGINE_PATHS)}")
    return value


def default_cache_budget_mb() -> int:
    """A quarter of physical memory, and at most half of what is free right now."""
    try:
        page = os.sysconf("SC_PAGE_SIZE")
        total = os.sysconf("SC_PHYS_PAGES") * page
        free = os.sysconf("SC_AVPHYS_PAGES") * page if sys.platform != "darwin" else total
    except (ValueError, OSError, AttributeError):
        return 2048
    return max(64, min(total // 4, free // 2) // MiB)


class DaemonSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="WARMFLEET_", protected_namespaces=())

    model: str = Field(
        "default", description="default | FILE.gguf | mlx-lm dir | HF id | tiny-random"
    )
    served_model_name: str | None = Field(None, description="id on /v1/models (default: derived)")
    engine: Literal["mlx", "sim"] = Field(
        "mlx",
        description="mlx: the model's forward pass; sim: a simulated one, each prefill chunk "
        "and decode step taking the time --profile says (everything else is the daemon's)",
    )
    profile: str | None = Field(
        None, description="--engine sim: a built-in performance profile's name or a profile file"
    )
    sim_speed: float = Field(
        1.0,
        gt=0,
        le=10_000,
        description="--engine sim: simulated time runs this many times faster than the clock",
    )
    sim_answer_tokens: int = Field(
        64, ge=1, description="--engine sim: answers end after this many tokens (or max_tokens)"
    )
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    cache_memory_mb: int | None = Field(
        None, ge=0, description="prefix-cache byte budget in MiB; 0 disables the cache"
    )
    block_size: int | None = Field(
        None, ge=8, le=8192, description="prefill chunk = cache block, in tokens (CPU 128, GPU 512)"
    )
    max_num_seqs: int = Field(16, ge=1, le=512, description="sequences prefilling or decoding")
    prefill_aging_picks: int = Field(
        16,
        ge=0,
        le=10_000,
        description="a waiting prompt counts one block shorter per N chunks prefilled for "
        "others (bounds a long prompt's wait); 0: plain shortest-first",
    )
    kv_bits: int | None = Field(
        None,
        description="quantize the KV cache to 8 or 4 bits (mlx-lm's quantized cache and "
        "attention): more cached tokens per GB in RAM and on disk; decoding sequences "
        "attend one at a time",
    )
    max_context: int | None = Field(
        None,
        ge=16,
        description="serve this many tokens of context, beyond the model's configured "
        "length if need be (logged as a warning: quality past it is the model's own)",
    )
    next_turn_prefill: bool = Field(
        True,
        description="after a chat response, prefill the conversation's next prefix (its "
        "answer and the next message's header) at idle priority",
    )
    default_max_tokens: int = Field(512, ge=1)
    max_output_tokens: int | None = Field(
        None,
        ge=1,
        description="no response runs longer, whatever its request asks (or leaves open, "
        "as Codex does): it ends as cut by its own limit (llama.cpp's --n-predict)",
    )
    default_temperature: float = Field(
        1.0, ge=0.0, le=2.0, description="when a request sets none (OpenAI's default is 1)"
    )
    max_request_bytes: int = Field(8 * MiB, ge=1024)
    log_level: str = "info"
    access_log: bool = Field(
        False,
        description="log every request, the router's and the operator's polls of health, "
        "status, cache and warm sets too (they are left out otherwise)",
    )

    # Telemetry.
    daemon_name: str | None = Field(
        None, description="this daemon's name on every metric (default: the host name)"
    )
    otlp_endpoint: str | None = Field(
        None, description="push metrics by OTLP here (or set OTEL_EXPORTER_OTLP_ENDPOINT)"
    )

    # Warm prompts and the push API.
    warm_prompts: str | None = Field(None, description="JSON/YAML file of prompts to warm")
    warm_prompts_concurrency: int = Field(2, ge=1, le=16)
    state_dir: str | None = Field(None, description="keep pushed warm sets here across restarts")
    admin_token: str | None = Field(
        None, description="bearer token for the admin routes (warm sets, cache)", repr=False
    )
    api_keys_file: str | None = Field(
        None,
        description="client API keys, one `TENANT KEY` a line (KEY as it is or sha256:HEX), "
        "read again when the file changes: every inference route then needs one",
    )
    tls_cert: str | None = Field(
        None,
        description="serve HTTPS with this certificate (cert-manager's tls.crt; read again "
        "when it changes); also presented to peers that ask for a client certificate",
    )
    tls_key: str | None = Field(None, description="its key (tls.key)")
    tls_ca: str | None = Field(
        None, description="verify peers' certificates with this CA bundle (ca.crt)"
    )
    tls_client_ca: str | None = Field(
        None,
        description="require a client certificate signed by this CA on the admin, warm-set "
        "and peer routes (mTLS), besides their token or grant",
    )
    tls_client_cert: str | None = Field(
        None, description="the certificate presented to peers (default: tls_cert)"
    )
    tls_client_key: str | None = Field(None, description="its key (default: tls_key)")
    public_url: list[str] = Field(
        default_factory=list,
        description="URLs this daemon is reached at through a proxy that rewrites Host or "
        "adds a path prefix: peer grants issued for them are honoured, as for the URL a "
        "request was addressed to",
    )
    max_warm_sets: int = Field(64, ge=1)
    max_warm_prompts_per_set: int = Field(64, ge=1)
    max_warm_message_chars: int = Field(200_000, ge=1)
    max_pinned_fraction: float = Field(0.8, gt=0.0, le=1.0)
    max_state_mb: int = Field(64, ge=1, description="bound on the --state-dir file")

    # Warm without prefill.
    snapshot_disk_mb: int = Field(
        4096, ge=0, description="disk for KV snapshots of warm blocks in --state-dir; 0: none"
    )
    cache_dir: str | None = Field(
        None,
        description="the disk tier: every cache block is also written here, and read back "
        "instead of prefilled (default: kv-cache in --state-dir)",
    )
    cache_disk_mb: int = Field(
        16384, ge=0, description="disk budget of the disk tier (LRU); 0: no disk tier"
    )
    warm_from: list[str] = Field(
        default_factory=list,
        description="peer daemons to copy warm blocks from before prefilling (same fingerprint)",
    )
    warm_from_deadline_s: float = Field(
        120.0,
        gt=0,
        le=3600,
        description="time to copy one warm prompt's blocks from its peers; then the rest is "
        "prefilled",
    )

    spill: Literal["auto", "always", "off"] = Field(
        "auto",
        description="a request the router sent here from the daemon holding its blocks: copy "
        "them from it when that is estimated faster than prefill (auto), always, or never",
    )
    spill_deadline_s: float = Field(
        30.0,
        gt=0,
        le=3600,
        description="the longest a spill copy may take; in auto, also at most the time the "
        "prefill was estimated to take (then the rest is prefilled)",
    )
    drain_seconds: float = Field(
        10.0,
        ge=0,
        le=3600,
        description="on SIGTERM: answer /readyz 'draining' and keep serving (peers copy this "
        "daemon's sessions away) this long before stopping",
    )

    @model_validator(mode="after")
    def _simulated_engine(self) -> DaemonSettings:
        sim_only = {"profile", "sim_speed", "sim_answer_tokens"} & self.model_fields_set
        if self.engine != "sim":
            if sim_only:
                flags = ", ".join("--" + f.replace("_", "-") for f in sorted(sim_only))
                raise ValueError(f"{flags}: only with --engine sim")
            return self
        if self.profile is None:
            names = ", ".join(builtin_profiles())
            raise ValueError(f"--engine sim needs --profile NAME|FILE (built-in: {names})")
        load_profile(self.profile)  # a bad profile stops `serve` at start
        # Not simulated: said at start rather than accepted and ignored.
        given = ["--kv-bits"] if "kv_bits" in self.model_fields_set else []
        if self.model != "default" and "model" in self.model_fields_set:
            given.append("--model (the profile names the model)")
        if given:
            raise ValueError(f"--engine sim does not simulate {', '.join(given)}")
        return self

    @model_validator(mode="after")
    def _known_engine_path(self) -> DaemonSettings:
        engine_path()  # the model loader reads it; a typo stops `serve` at start instead
        return self

    @model_validator(mode="after")
    def _public_url_needs_a_token(self) -> DaemonSettings:
        if self.public_url and not self.admin_token:
            raise ValueError(
                "--public-url only applies with an admin token (--admin-token-file or "
                "WARMFLEET_ADMIN_TOKEN): without one the peer routes take no grant"
            )
        return self

    @field_validator("kv_bits")
    @classmethod
    def _kv_bits(cls, bits: int | None) -> int | None:
        if bits is not None and bits not in (4, 8):
            raise ValueError(f"--kv-bits takes 8 or 4, not {bits}")
        return bits

    @field_validator("warm_from", "public_url")
    @classmethod
    def _base_urls(cls, urls: list[str], info: ValidationInfo) -> list[str]:
        bad = [u for u in urls if not re.fullmatch(r"https?://[^\s/?#]+(/[^\s?#]*)?", u)]
        if bad:
            flag = "--" + str(info.field_name).replace("_", "-")
            raise ValueError(f"{flag} takes http(s) base URLs; not: {', '.join(bad)}")
        return [u.rstrip("/") for u in urls]

    def resolved_cache_dir(self) -> str | None:
        if self.cache_disk_mb == 0:
            return None
        if self.cache_dir:
            return self.cache_dir
        return os.path.join(self.state_dir, "kv-cache") if self.state_dir else None

    def cache_budget_bytes(self) -> int:
        mb = self.cache_memory_mb if self.cache_memory_mb is not None else default_cache_budget_mb()
        return mb * MiB

    def tls(self) -> TlsOptions:
        return TlsOptions(
            self.tls_cert,
            self.tls_key,
            self.tls_ca,
            self.tls_client_ca,
            self.tls_client_cert,
            self.tls_client_key,
        )

    def binds_loopback(self) -> bool:
        return self.host in ("127.0.0.1", "::1", "localhost") or self.host.startswith("127.")

    def resolved_block_size(self, on_gpu: bool) -> int:
        # CPU prefill is about as fast in 128-token chunks as in 512 ones, and small
        # chunks interleave better with decoding; GPUs want larger matmuls.
        return self.block_size or (512 if on_gpu else 128)
