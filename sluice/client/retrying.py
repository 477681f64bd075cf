"""When the client tries a request again: a 429 or 503 answer, or a connection refused, waits what
the answer's ``Retry-After`` says (else an exponential backoff with jitter) and tries again, within
a number of attempts and a total time. A POST is tried again only with an ``Idempotency-Key`` (the
client sends one on each POST while retries are on), so a retry never does the work twice."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

import httpx

RETRY_STATUSES = (429, 503)


@dataclass(frozen=True)
class Retry:
    """The retry setting of a client (``Client(url, key, retry=Retry(attempts=6))``).

    ``attempts``: tries in all, the first one included (1: never retry); ``total_seconds``: no
    wait goes past this long after the first try (a ``Retry-After`` longer than what is left is
    not waited for: the error is raised at once); ``backoff_seconds`` and ``max_backoff_seconds``:
    the wait before try n when the answer names none, ``backoff * 2**(n-2)`` up to the maximum,
    each drawn between half and all of it."""

    attempts: int = 4
    total_seconds: float = 60.0
    backoff_seconds: float = 0.5
    max_backoff_seconds: float = 8.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError("Retry.attempts: at least 1 (the first try)")
        if self.total_seconds < 0 or self.backoff_seconds < 0 or self.max_backoff_seconds < 0:
            raise ValueError("Retry: seconds are never negative")

    @property
    def enabled(self) -> bool:
        return self.attempts > 1

    def backoff(self, attempt: int, draw: float | None = None) -> float:
        """The wait after failed try ``attempt`` (1-based) when the server named none."""
        full = min(self.max_backoff_seconds, self.backoff_seconds * 2 ** (attempt - 1))
        return full * (0.5 + 0.5 * (random.random() if draw is None else draw))

    def delay(self, attempt: int, elapsed: float, retry_after: float | None) -> float | None:
        """How long to wait before the next try after failed try ``attempt``, ``elapsed`` seconds
        after the first began; None: no more tries."""
        if attempt >= self.attempts:
            return None
        wait = retry_after if retry_after is not None else self.backoff(attempt)
        if elapsed + wait > self.total_seconds:
            return None
        return wait


NO_RETRY = Retry(attempts=1)


def retry_after(response: httpx.Response) -> float | None:
    """The answer's ``Retry-After`` in seconds (a number, or an HTTP date), None without one."""
    value = response.headers.get("Retry-After", "").strip()
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = (when - datetime.now(UTC)).total_seconds()
    if not math.isfinite(seconds):
        return None
    return max(0.0, seconds)


def retriable(exc: Exception) -> bool:
    """A transport failure after which the request certainly never reached the server."""
    return isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout)
