"""Choosing a backend: plain Python, no I/O; every choice is deterministic in its inputs.

A policy is composed of pieces, as the Gateway API Inference Extension's scheduler is:
filters narrow the candidates (ready, serves the model, tenant share, bounded load,
session pin),
scorers rank them (prefill time saved by the cache, cached tokens, load, session-key
hash, a hash of the request, round-robin turn), a picker picks and orders the
fallbacks. `prefix` (the default): the most prefill time saved by the backend's cache
(its predicted cached tokens by tier, RAM or disk, priced with the costs it measured;
cached tokens where no backend published costs), subject to bounded load (consistent
hashing with bounded loads: no backend may take a request that would put it above
ceil((1 + epsilon) x the mean in-flight count)); ties (savings within a fifth) by load,
then the larger share in RAM, then a rendezvous hash of the request so equal
candidates share new work. A session key keeps a session
where it is while that backend is eligible. `round-robin`, `least-load` and `session`
(rendezvous hash of the session key) exist to compare against. The policies are named
in one registry (`registry.REGISTRY`); new routing ideas are new pieces composed there.
"""

from warmfleet_router.policy.compose import ADMISSION, Pieces, Policy, admit
from warmfleet_router.policy.filters import (
    BoundedLoad,
    Filter,
    Ready,
    ServesModel,
    SessionPin,
    TenantShare,
    capacity,
    eligible,
)
from warmfleet_router.policy.model import (
    Candidate,
    Decision,
    ModelNotFound,
    NoBackendReady,
    Reason,
    RoutingError,
    RoutingRequest,
)
from warmfleet_router.policy.pickers import BestPicker, Picker, RingPicker
from warmfleet_router.policy.registry import (
    DEFAULT_EPSILON,
    POLICIES,
    REGISTRY,
    PolicyName,
    build,
    choose,
    policy_table,
)
from warmfleet_router.policy.scorers import (
    AffinityHash,
    CachedTokens,
    FasterTier,
    LeastLoad,
    RoundRobin,
    Scorer,
    TieHash,
    TimeSaved,
    bands,
    prefill_saved,
    rendezvous,
)

__all__ = [
    "ADMISSION",
    "DEFAULT_EPSILON",
    "POLICIES",
    "REGISTRY",
    "AffinityHash",
    "BestPicker",
    "BoundedLoad",
    "CachedTokens",
    "Candidate",
    "Decision",
    "FasterTier",
    "Filter",
    "LeastLoad",
    "ModelNotFound",
    "NoBackendReady",
    "Picker",
    "Pieces",
    "Policy",
    "PolicyName",
    "Ready",
    "Reason",
    "RingPicker",
    "RoundRobin",
    "RoutingError",
    "RoutingRequest",
    "Scorer",
    "ServesModel",
    "SessionPin",
    "TenantShare",
    "TieHash",
    "TimeSaved",
    "admit",
    "bands",
    "build",
    "capacity",
    "choose",
    "eligible",
    "policy_table",
    "prefill_saved",
    "rendezvous",
]
