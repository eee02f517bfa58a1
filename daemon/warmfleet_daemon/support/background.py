"""One background thread with a stop flag and a condition that wakes it: how the warm-up
scheduler and the cache diagnostics each run beside the engine."""

from __future__ import annotations

import threading
from collections.abc import Callable


class BackgroundThread:
    """A daemon thread running `target` until `stop()`. `wake` is a condition on the
    owner's lock: the owner waits on it in its loop and notifies it when there is work;
    the loop ends once `stopping` is true."""

    def __init__(self, name: str, lock: threading.Lock | threading.RLock) -> None:
        self.name = name
        self.wake = threading.Condition(lock)
        self.stopping = False
        self._thread: threading.Thread | None = None

    def start(self, target: Callable[[], None]) -> None:
        self._thread = threading.Thread(target=target, name=self.name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        with self.wake:
            self.stopping = True
            self.wake.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=timeout)
