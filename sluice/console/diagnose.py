"""Why a job is not moving, as the console's job page says it: ``sluice.ops.diagnosis``, the same
diagnosis the API gives (``waiting``, ``waiting_for``), from what the page read.
"""

from __future__ import annotations

from datetime import datetime

from sluice.ops import diagnosis
from sluice.ops.health import QueuePosition


def why_waiting(
    row: dict,
    *,
    position: QueuePosition | None,
    workers: int | None,
    unsent: list[dict],
    ahead: int,
    lease_seconds: float,
    now: datetime,
    published_at: datetime | None = None,
    redeliver_after: float = 60.0,
    measured: diagnosis.Measured | None = None,
) -> tuple[str, str] | None:
    """(level, sentence) for an active job, level being info (waiting) or warning (stalled).
    ``measured``: the fleet, pace and running jobs (``diagnosis.measured``); without it, a fleet
    of ``workers`` one-thread workers (None: the queue did not answer) and no pace."""
    if measured is None:
        fleet = (
            diagnosis.Fleet(False) if workers is None else diagnosis.Fleet(True, workers, workers)
        )
        measured = diagnosis.Measured(fleet)
    found = diagnosis.diagnose(
        diagnosis.Facts(
            row=row,
            now=now,
            measured=measured,
            ahead=ahead,
            position=position,
            unsent=tuple(unsent),
            published_at=published_at,
            lease_seconds=lease_seconds,
            redeliver_after=redeliver_after,
        )
    )
    return None if found is None else (found.level, found.sentence)
