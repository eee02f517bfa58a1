"""Threads that run the model, and the care their end needs: MLX keeps a thread-local
compile cache whose destructor takes the GIL, so such a thread must be gone (the OS
thread, not just its Python part) before the interpreter finalizes."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until_gone(thread: threading.Thread, timeout: float = 2.0) -> None:
    """Wait for the OS thread itself to end, not just its Python part: MLX's
    thread-local compile cache takes the GIL in its destructor, and if that runs while
    the interpreter is finalizing, the process aborts ("terminate called ...")."""
    if not os.path.isdir("/proc/self/task"):
        time.sleep(0.1)  # no /proc (macOS): give the destructor time to run
        return
    deadline = time.monotonic() + timeout
    while os.path.exists(f"/proc/self/task/{thread.native_id}"):
        if time.monotonic() > deadline:
            return
        time.sleep(0.01)


def on_a_thread_of_its_own(run: Callable[[], T], name: str) -> T:
    """`run()` on a short-lived thread that is gone when this returns. Running the model
    leaves MLX's thread-local compile cache on the calling thread; on a long-lived one (an
    event loop's, a test's) its destructor would run while the interpreter finalizes and
    abort the process. Exceptions are raised again on the caller's thread."""
    found: list[T] = []
    errors: list[BaseException] = []

    def target() -> None:
        try:
            found.append(run())
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=target, name=name)
    thread.start()
    thread.join()
    wait_until_gone(thread)
    if errors:
        raise errors[0]
    return found[0]
