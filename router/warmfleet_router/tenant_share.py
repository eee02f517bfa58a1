"""Which tenants use which backends, so that one tenant's burst is kept off the backends
another tenant is using (shuffle sharding's aim, with the fleet's own load as the shard).

A tenant is *over its share* when it has at least as many requests in flight as the
fleet has backends per active tenant (a tenant is active while it has a request in
flight or had one end within `window` seconds). A backend is *another tenant's* while
another tenant has a request in flight there or had one end there within the window.
The `tenant share` filter (`policy.filters.TenantShare`) sends a request of a tenant
over its share only to backends no other tenant is using, when there are any. Plain
Python, no I/O; tenants are the keys file's (a request without a tenant is not counted).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable

DEFAULT_WINDOW_S = 60.0


class TenantShare:
    def __init__(
        self, window_s: float = DEFAULT_WINDOW_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.window_s = window_s  # 0: off (no tenant is ever over its share)
        self._clock = clock
        self._in_flight: dict[str, Counter[str]] = {}  # backend -> tenant -> requests
        self._fleet: Counter[str] = Counter()  # tenant -> requests in flight anywhere
        self._ended: dict[str, dict[str, float]] = {}  # backend -> tenant -> last end
        self._active: dict[str, float] = {}  # tenant -> last end anywhere

    @property
    def on(self) -> bool:
        return self.window_s > 0

    # -- what the planner reports -----------------------------------------------------

    def started(self, tenant: str | None, backend: str) -> None:
        if tenant is None or not self.on:
            return
        self._in_flight.setdefault(backend, Counter())[tenant] += 1
        self._fleet[tenant] += 1

    def finished(self, tenant: str | None, backend: str) -> None:
        if tenant is None or not self.on:
            return
        here = self._in_flight.get(backend)
        if here is None or here[tenant] <= 0:
            return  # not counted when it started (the share was turned on since)
        here[tenant] -= 1
        if not here[tenant]:
            del here[tenant]
            if not here:  # a backend that left keeps nothing here
                del self._in_flight[backend]
        self._fleet[tenant] -= 1
        if not self._fleet[tenant]:
            del self._fleet[tenant]
        now = self._clock()
        self._ended.setdefault(backend, {})[tenant] = now
        self._active[tenant] = now

    # -- what the policy reads --------------------------------------------------------

    def over_share(self, tenant: str | None, backends: int) -> bool:
        """Whether `tenant` holds at least its share of a fleet of `backends`."""
        if tenant is None or not self.on or backends <= 0:
            return False
        active = self.active_tenants() | {tenant}
        return self._fleet[tenant] * len(active) >= backends and len(active) > 1

    def others(self, tenant: str | None, backends: Iterable[str]) -> dict[str, int]:
        """Per backend, how many other tenants are using it (in flight there, or ended
        there within the window)."""
        if tenant is None or not self.on:
            return {}
        since = self._clock() - self.window_s
        out = {}
        for name in backends:
            users = {t for t, n in self._in_flight.get(name, {}).items() if n}
            ended = self._ended.get(name)
            if ended:
                for t, at in list(ended.items()):
                    if at >= since:
                        users.add(t)
                    else:
                        del ended[t]  # out of the window: forgotten as it is read
            users.discard(tenant)
            out[name] = len(users)
        return out

    def active_tenants(self) -> set[str]:
        since = self._clock() - self.window_s
        for t in [t for t, at in self._active.items() if at < since]:
            del self._active[t]
        return set(self._fleet) | set(self._active)
