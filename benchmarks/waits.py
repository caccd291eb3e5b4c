"""Bounded waits of the benchmark harnesses."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(predicate: Callable[[], object], timeout: float, step: float = 0.5) -> bool:
    """Poll ``predicate`` every ``step`` seconds for at most ``timeout`` seconds; True as
    soon as it is truthy, False when the time is up."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return False
