"""The per-key request budget of the HTTP API (``SLUICE_API_RATE_PER_MINUTE``): a sliding window of
one minute, per API process (each process of several counts its own share).

Every answer to a keyed request tells the budget in the IETF draft's fields
(draft-ietf-httpapi-ratelimit-headers-10): ``RateLimit-Policy: "per-key";q=120;w=60`` (the quota
and its window) and ``RateLimit: "per-key";r=117;t=42`` (requests left, and the seconds until one
more is allowed again), so a client slows down before it meets the 429."""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

WINDOW_SECONDS = 60.0
POLICY = "per-key"


@dataclass(frozen=True)
class Budget:
    """What one request left of its key's budget: ``wait`` > 0 when it was refused."""

    quota: int
    remaining: int
    reset: float  # seconds until the window gives back a request (0: nothing is spent)
    wait: float = 0.0

    def headers(self) -> dict[str, str]:
        """``RateLimit-Policy`` and ``RateLimit`` for this answer (none without a limit)."""
        if self.quota <= 0:
            return {}
        window = int(WINDOW_SECONDS)
        return {
            "RateLimit-Policy": f'"{POLICY}";q={self.quota};w={window}',
            "RateLimit": f'"{POLICY}";r={self.remaining};t={math.ceil(self.reset)}',
        }


class RateLimiter:
    def __init__(self, per_minute: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.per_minute = per_minute
        self.clock = clock
        self._seen: dict[int, deque[float]] = {}
        self._lock = threading.Lock()

    def take(self, key_id: int) -> float:
        """0 when the request may go; else the seconds until it may (for ``Retry-After``)."""
        return self.spend(key_id).wait

    def spend(self, key_id: int) -> Budget:
        """Count one request of ``key_id``, or refuse it (``wait`` > 0), with what is left."""
        if self.per_minute <= 0:
            return Budget(0, 0, 0.0)
        now = self.clock()
        with self._lock:
            seen = self._seen.setdefault(key_id, deque())
            while seen and seen[0] <= now - WINDOW_SECONDS:
                seen.popleft()
            if len(seen) >= self.per_minute:
                wait = max(0.001, seen[0] + WINDOW_SECONDS - now)
                return Budget(self.per_minute, 0, wait, wait)
            seen.append(now)
            reset = seen[0] + WINDOW_SECONDS - now
            return Budget(self.per_minute, self.per_minute - len(seen), reset)
