"""The start of an attempt and its signs of life: claim, stage counts, heartbeat."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import bindparam, true, update
from sqlmodel import Session, SQLModel

from sluice.errors import LeaseLost
from sluice.storage import pauses
from sluice.storage.db import stored
from sluice.storage.jobs.conditional import (
    CLAIMABLE_NOW,
    CLAIMABLE_UNPAUSED,
    NOW,
    RUNNING_ON_LEASE,
    compare_and_set,
    fenced,
)
from sluice.storage.jobs.event_log import add_event, describe_progress, log_event
from sluice.storage.jobs.job_values import ClaimResult
from sluice.storage.jobs.lookups import get_job, read_job
from sluice.storage.jobs.outbox_row import publish
from sluice.storage.jobs.statuses import CLAIMABLE
from sluice.storage.models import Job, JobStatus, Stage

OUTBOX = SQLModel.metadata.tables["outbox"]
_TAKEN = (
    update(OUTBOX)
    .where(OUTBOX.c.job_id == bindparam("w_job"), OUTBOX.c.in_flight == true())
    .values(in_flight=None)
)
"""The job's messages are off the queue (made once): its rows no longer count as in flight."""


def _taken(session: Session, job_id: int) -> None:
    """A delivery of the job was taken, whatever the claim decides: its outbox rows are no longer
    in flight (``outbox.load_by_dataset`` counts the messages on the queue from them)."""
    session.execute(_TAKEN, {"w_job": job_id})


def claim(*, session: Session, job_id: int, worker_id: str, lease_seconds: float) -> ClaimResult:
    """pending/retrying -> running, or a recorded no-op saying why not. Either way the message was
    taken off the queue: the job's outbox rows stop counting as in flight, in the same commit.

    A pause is not looked up first: the compare-and-set itself refuses a job a pause covers, and
    only then is the pause read (one statement less per claim)."""
    found = read_job(session, job_id)
    if found is None:
        return ClaimResult(None, False, "no such job")
    job, now = found.job, found.now
    reason = _why_not(job, now, lease_seconds)
    if reason:
        add_event(session, job, "noop", message=reason, actor=worker_id)
        _taken(session, job_id)
        session.commit()
        return ClaimResult(job, False, reason)
    before = job.status
    ok = compare_and_set(
        session,
        job,
        CLAIMABLE_UNPAUSED,
        status=JobStatus.running,
        stage=Stage.parsing,
        done=0,
        total=0,
        attempt=job.attempt + 1,
        lease=job.lease + 1,
        worker_id=worker_id,
        heartbeat_at=now,
        started_at=job.started_at or now,
        next_attempt_at=None,
        embedded_count=0,
        cached_count=0,
        waiting_for=None,
        now=now,
    )
    if not ok:
        session.rollback()
        job = stored(session, Job, job_id, populate_existing=True)
        held = pauses.pause_for(session=session, dataset_id=job.dataset_id)
        if held is not None and job.status in CLAIMABLE:  # a pause covers it: wait for the resume
            return _refuse_paused(session, job, held, worker_id, now)
        reason = f"delivery ignored: claimed concurrently (now {job.status.value})"
        add_event(session, job, "noop", message=reason, actor=worker_id)
        _taken(session, job_id)
        session.commit()
        return ClaimResult(job, False, reason)
    add_event(
        session,
        job,
        "claimed",
        actor=worker_id,
        from_status=before,
        to_status=JobStatus.running,
        message=f"attempt {job.attempt} of {job.max_attempts}",
        data={"lease": job.lease},
    )
    _taken(session, job_id)
    session.commit()
    return ClaimResult(job, True, document=found.document, dataset=found.dataset)


def _why_not(job: Job, now: datetime, lease_seconds: float) -> str:
    """Why a delivery of ``job`` does not claim it ("": it may)."""
    if job.status in JobStatus.final():
        return f"delivery ignored: job is already {job.status.value}"
    if job.status == JobStatus.running:
        fresh = job.heartbeat_at and job.heartbeat_at > now - timedelta(seconds=lease_seconds)
        return (
            f"delivery ignored: already running on {job.worker_id}"
            if fresh
            else "delivery ignored: running with a stale heartbeat; the reaper takes it back"
        )
    if (
        job.status == JobStatus.retrying
        and job.next_attempt_at
        and job.next_attempt_at > now + timedelta(seconds=1)
    ):
        return f"delivery ignored: next attempt is due at {job.next_attempt_at:%H:%M:%S}"
    return ""


def _refuse_paused(
    session: Session, job: Job, held: Any, worker_id: str, now: datetime, attempts: int = 5
) -> ClaimResult:
    """The job's dataset (or the whole queue) is paused: leave the job waiting with an unsent outbox
    row, which the dispatcher publishes once the pause is lifted."""
    reason = f"delivery ignored: {pauses.describe(held)}; it runs when resumed"
    # The message is consumed either way: an operator's change that lands between our read and this
    # compare-and-set (a priority, "run next") must not leave the job with no message and no row.
    current: Job | None = job
    for _ in range(attempts):
        if compare_and_set(session, job, CLAIMABLE_NOW, now=now):
            add_event(
                session, job, "noop", message=reason, actor=worker_id, data={"paused": held.scope}
            )
            publish(session, job, max(now, job.next_attempt_at or now))
            break
        session.rollback()
        current = get_job(session=session, job_id=job.id)
        if current is None or current.status not in CLAIMABLE:
            break  # cancelled, claimed or gone meanwhile: nothing waits for this message
        job = current
    _taken(session, job.id)
    session.commit()
    return ClaimResult(current, False, reason)


def progress(
    *, session: Session, job_id: int, lease: int, stage: Stage, done: int, total: int, **extra: Any
) -> bool:
    """Write stage counts and the heartbeat, and the counts as a ``progress`` event of the log (in
    the same transaction: one small insert per write, which the runner makes at most twice a second,
    never per chunk; none for the last write of indexing, which the success follows at once); return
    cancel_requested. LeaseLost if not ours (and no event). The fenced update returns what the
    event needs (no second read of the row just written)."""
    row = fenced(
        session,
        job_id,
        RUNNING_ON_LEASE,
        bound={"w_lease": lease},
        returning=("cancel_requested", "attempt", "worker_id"),
        stage=stage,
        done=done,
        total=total,
        heartbeat_at=NOW,
        **extra,
    )
    if row is None:
        session.rollback()
        raise LeaseLost(f"job {job_id} is no longer owned by lease {lease}")
    if not (stage == Stage.indexing and done >= total):  # the success event says that one
        log_event(
            session,
            job_id,
            "progress",
            actor=row.worker_id or "system",
            stage=stage,
            attempt=row.attempt,
            message=describe_progress(stage, done, total),
            data={"done": done, "total": total},
        )
    session.commit()
    return bool(row.cancel_requested)


def heartbeat(*, session: Session, job_id: int, lease: int) -> bool:
    ok = fenced(session, job_id, RUNNING_ON_LEASE, bound={"w_lease": lease}, heartbeat_at=NOW)
    session.commit()
    return ok is not None
