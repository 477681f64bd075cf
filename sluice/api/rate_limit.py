"""The per-key request budget of the HTTP API (``SLUICE_API_RATE_PER_MINUTE``): a sliding window of
one minute, per API process (each process of several counts its own share)."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

WINDOW_SECONDS = 60.0


class RateLimiter:
    def __init__(self, per_minute: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.per_minute = per_minute
        self.clock = clock
        self._seen: dict[int, deque[float]] = {}
        self._lock = threading.Lock()

    def take(self, key_id: int) -> float:
        """0 when the request may go; else the seconds until it may (for ``Retry-After``)."""
        if self.per_minute <= 0:
            return 0.0
        now = self.clock()
        with self._lock:
            seen = self._seen.setdefault(key_id, deque())
            while seen and seen[0] <= now - WINDOW_SECONDS:
                seen.popleft()
            if len(seen) >= self.per_minute:
                return max(0.001, seen[0] + WINDOW_SECONDS - now)
            seen.append(now)
            return 0.0
