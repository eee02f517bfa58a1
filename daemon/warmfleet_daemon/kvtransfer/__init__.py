"""Warm without prefill: pinned prefix-cache blocks kept on disk across restarts and
copied from warm peers, keyed by a fingerprint of everything that makes KV valid."""
