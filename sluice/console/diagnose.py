"""Why a job is not moving: waiting its turn, or stalled (no worker, lost message, silent worker).

A pure function over what the pages already read, so that every branch is testable.
"""

from __future__ import annotations

from datetime import datetime

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
) -> tuple[str, str] | None:
    """(level, sentence) for an active job, level being info (waiting) or warning (stalled)."""
    status = row["status"]
    no_workers = workers == 0
    worker_note = (
        "no worker is alive, so nothing will run until one starts (`sluice serve worker`)"
        if no_workers
        else f"{workers} worker(s) alive"
        if workers is not None
        else "worker count unknown (queue unreachable)"
    )
    if status == "running":
        return _running(row, now=now, lease_seconds=lease_seconds)
    if status == "retrying":
        return _retrying(row, now=now, no_workers=no_workers, worker_note=worker_note)
    if status != "pending":
        return None
    return _pending(
        position=position,
        no_workers=no_workers,
        worker_note=worker_note,
        unsent=unsent,
        ahead=ahead,
        now=now,
        published_at=published_at,
        redeliver_after=redeliver_after,
    )


def _running(row: dict, *, now: datetime, lease_seconds: float) -> tuple[str, str]:
    """A running job: cancelling, stalled (silent past its lease), or its progress and last beat."""
    beat = datetime.fromisoformat(row["heartbeat_at"]) if row.get("heartbeat_at") else None
    silent = (now - beat).total_seconds() if beat else None
    if row.get("cancel_requested"):
        return (
            "info",
            "Cancel requested: the worker stops at its next batch and removes what it wrote.",
        )
    if silent is not None and silent > lease_seconds:
        return "warning", (
            f"Stalled: worker {row.get('worker_id')} has not reported for {silent:.0f} s "
            f"(lease {lease_seconds:.0f} s). The reaper takes the job back and retries it."
        )
    return "info", (
        f"Running on {row.get('worker_id')} ({row['progress']}); last heartbeat {silent:.0f} s ago."
        if silent is not None
        else f"Running on {row.get('worker_id')}."
    )


def _retrying(row: dict, *, now: datetime, no_workers: bool, worker_note: str) -> tuple[str, str]:
    """A retrying job: waiting for a service (no attempt spent), or its next attempt's due time."""
    due = datetime.fromisoformat(row["next_attempt_at"]) if row.get("next_attempt_at") else None
    when = (
        f"in {(due - now).total_seconds():.0f} s"
        if due and due > now
        else "now (waiting for a worker to take it)"
    )
    level = "warning" if no_workers else "info"
    if row.get("waiting_for"):
        since = datetime.fromisoformat(row["waiting_since"]) if row.get("waiting_since") else None
        waited = f" for {(now - since).total_seconds():.0f} s" if since else ""
        return level, (
            f"Waiting for {row['waiting_for']}{waited}: not the job's failure, no attempt is "
            f"spent. It looks again {when} and resumes by itself; {worker_note}."
        )
    return level, (
        f"Retrying: attempt {row['attempt'] + 1} of {row['max_attempts']} is due {when}; "
        f"{worker_note}."
    )


def _pending(
    *,
    position: QueuePosition | None,
    no_workers: bool,
    worker_note: str,
    unsent: list[dict],
    ahead: int,
    now: datetime,
    published_at: datetime | None,
    redeliver_after: float,
) -> tuple[str, str]:
    """A pending job: the queue unreachable, its message still in the outbox, its place in the
    queue, handed to a worker, or its message lost."""
    if position is not None and not position.reachable:
        return "warning", (
            f"The queue Redis is unreachable ({position.error}); by the database, {ahead} "
            "job(s) wait ahead of this one. It is published when the queue answers again."
        )
    if unsent:
        err = unsent[-1].get("last_error")
        if err:
            return "warning", (
                f"Not on the queue yet: publishing it failed ({err}). The worker's recovery "
                "publishes it as soon as the queue answers."
            )
        return ("warning" if no_workers else "info"), (
            "Not on the queue yet: its message waits in the outbox until the next dispatch. The "
            "queue holds only a few messages per worker thread; the next go by priority, then to "
            "the dataset with the least work under way, then the oldest (`sluice run-next` moves "
            f"a job to the front); {worker_note}."
        )
    if position is None:
        return "info", f"{ahead} job(s) wait ahead of this one; {worker_note}."
    if position.beyond_scan:
        return ("warning" if no_workers else "info"), (
            f"Waiting in the queue behind more than {position.scanned:,} other jobs "
            f"({position.length:,} queued); {worker_note}."
        )
    if position.position is None:
        since = (now - published_at).total_seconds() if published_at else None
        if since is not None and since < redeliver_after and not no_workers:
            # the usual case right after a publish: a worker has taken the message and is claiming
            # the job
            return "info", (
                f"Handed to a worker {since:.0f} s ago; it starts in a moment; {worker_note}."
            )
        return "warning", (
            "Its queue message is not in the queue"
            + (f" (published {since:.0f} s ago)" if since is not None else "")
            + ": it may have been lost. The worker's recovery publishes it again once it has "
            f"been missing for {redeliver_after:.0f} s (SLUICE_REDELIVER_AFTER_SECONDS)."
        )
    level = "warning" if no_workers else "info"
    return level, (
        f"Waiting in the queue: position {position.position} of {position.length}; {worker_note}."
    )
