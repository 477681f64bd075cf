"""How a failed attempt comes back: backoff for a retry, polling for a wait on a dependency."""

from __future__ import annotations

import random
from dataclasses import dataclass


def backoff_delay(
    attempt: int, *, base: float, cap: float, rng: random.Random | None = None
) -> tuple[float, float]:
    """Exponential backoff with full jitter: returns (ceiling, drawn delay) for a failed attempt."""
    ceiling = min(cap, base * (2 ** max(0, attempt - 1)))
    return ceiling, (rng or random).uniform(0, ceiling)


@dataclass(frozen=True)
class RetryPolicy:
    """When a transient failure with attempts left runs again: exponential backoff from
    ``base_delay`` up to ``max_delay``, with full jitter drawn from ``rng``."""

    base_delay: float
    max_delay: float
    rng: random.Random | None = None

    def backoff(self, attempt: int) -> tuple[float, float]:
        """(ceiling, drawn delay) after the failure of ``attempt``."""
        return backoff_delay(attempt, base=self.base_delay, cap=self.max_delay, rng=self.rng)

    def poll(self, seconds: float) -> float:
        """A delay of about ``seconds``, jittered, before a waiting job looks again."""
        return (self.rng or random).uniform(seconds / 2, seconds)


@dataclass(frozen=True)
class WaitPolicy:
    """A failure that is not the job's own (a dependency is down): the job waits for
    ``waiting_for``, looking again every ``poll_seconds`` or so with the attempt given back, until
    the wait that began with the first such round exceeds ``max_wait_seconds``."""

    waiting_for: str
    poll_seconds: float = 15.0
    max_wait_seconds: float = 6 * 3600.0
