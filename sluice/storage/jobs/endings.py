"""An attempt that ends without success: it fails, waits, is cancelled, or is handed back.

Each is fenced on the attempt's lease and tried again while only the job's own heartbeat, which
bumps the version several times a second, made its compare-and-set lose.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from sqlmodel import Session

from sluice import faults
from sluice.errors import ErrorKind
from sluice.storage import webhook_records
from sluice.storage.clock import db_now
from sluice.storage.jobs.conditional import ON_LEASE, RUNNING_ON_LEASE, compare_and_set
from sluice.storage.jobs.event_log import add_event, describe_progress, value_of
from sluice.storage.jobs.job_values import JobError
from sluice.storage.jobs.lookups import get_job
from sluice.storage.jobs.outbox_row import publish
from sluice.storage.jobs.retry_policy import RetryPolicy, WaitPolicy
from sluice.storage.models import Job, JobStatus, Stage


def while_ours(
    session: Session,
    job_id: int,
    lease: int,
    once: Callable[[], Job | None],
    *,
    stale_before: datetime | None = None,
    attempts: int = 5,
) -> Job | None:
    """Run a compare-and-set transition of a running attempt until it lands, or the job is no
    longer this lease's (or, for the reaper, no longer stale). Losing only to a beat of the job's
    own heartbeat, which bumps the version several times a second, is no reason to give up."""
    for _ in range(attempts):
        done = once()
        if done is not None:
            return done
        job = get_job(session=session, job_id=job_id)
        session.rollback()
        if job is None or job.lease != lease or job.status != JobStatus.running:
            return None
        if stale_before is not None and (
            job.heartbeat_at is None or job.heartbeat_at >= stale_before
        ):
            return None
    return None


def fail(
    *,
    session: Session,
    job_id: int,
    lease: int,
    error: JobError,
    worker_id: str,
    retry: RetryPolicy,
    wait: WaitPolicy | None = None,
    page_count: int | None = None,
    stale_before: datetime | None = None,
) -> Job | None:
    """End a failed attempt: retrying after ``retry``'s backoff (transient, budget left) or failed
    (dead letter). ``page_count``, when the attempt got as far as counting pages, stays on the job.

    ``stale_before`` (the reaper's): only while the heartbeat is still older than that.
    ``wait`` (a dependency is down, not the job's failure): the job waits as the policy says; when
    the wait runs out it is a dead letter that says so.
    """
    return while_ours(
        session,
        job_id,
        lease,
        lambda: _fail_once(
            session,
            job_id,
            lease,
            error=error,
            worker_id=worker_id,
            retry=retry,
            wait=wait,
            page_count=page_count,
            stale_before=stale_before,
        ),
        stale_before=stale_before,
    )


def _fail_once(
    session: Session,
    job_id: int,
    lease: int,
    *,
    error: JobError,
    worker_id: str,
    retry: RetryPolicy,
    wait: WaitPolicy | None,
    page_count: int | None,
    stale_before: datetime | None,
) -> Job | None:
    """One try of ``fail``: the job as it ended, or None when the try lost (or the job is gone)."""
    job = get_job(session=session, job_id=job_id)
    if job is None or job.lease != lease or job.status != JobStatus.running:
        return None
    if stale_before is not None and (job.heartbeat_at is None or job.heartbeat_at >= stale_before):
        session.rollback()
        return None
    errors = error.columns(page_count)
    if job.cancel_requested:
        return cancelled(session, job, actor=worker_id, **errors)
    faults.hit("before_fail_write", job_id=job_id)
    now = db_now(session)
    data: dict[str, Any] = {"code": error.code, "kind": error.kind.value}
    kind, gave_up_waiting = error.kind, False
    if wait is not None:
        since = job.waiting_since or now
        waited = (now - since).total_seconds()
        if waited <= wait.max_wait_seconds:
            return _wait(
                session,
                job,
                now=now,
                since=since,
                wait=wait,
                retry=retry,
                worker_id=worker_id,
                data=data,
                errors=errors,
            )
        kind = _outage_too_long(errors, waited, wait, error.message)
        gave_up_waiting = True
    if kind == ErrorKind.transient and job.attempt < job.max_attempts and not gave_up_waiting:
        landed = _retry_later(
            session, job, lease, now=now, retry=retry, message=error.message,
            worker_id=worker_id, data=data, errors=errors,
        )  # fmt: skip
    else:
        if kind == ErrorKind.transient and not gave_up_waiting:
            errors["error_message"] = f"gave up after {job.attempt} attempts: {error.message}"
        landed = _dead_letter(
            session, job, lease, now=now, worker_id=worker_id, data=data, errors=errors
        )
    if not landed:
        session.rollback()
        return None
    session.commit()
    return job


def _outage_too_long(
    errors: dict[str, Any], waited: float, wait: WaitPolicy, message: str
) -> ErrorKind:
    """The wait for a dependency ran out: the error becomes a transient ``outage_too_long`` that
    says how long it waited and for what (a dead letter, not a retry)."""
    kind = errors["error_kind"] = ErrorKind.transient
    errors["error_code"] = "outage_too_long"
    errors["error_message"] = (
        f"waited {waited / 3600:.1f} h for {wait.waiting_for}, longer than "
        f"SLUICE_MAX_OUTAGE_SECONDS ({wait.max_wait_seconds:.0f} s): {message}"
    )
    errors["fix_hint"] = (
        f"Bring {wait.waiting_for} back, then retry the job (Retry in the console, or "
        "`sluice retry`)."
    )
    return kind


def _retry_later(
    session: Session,
    job: Job,
    lease: int,
    *,
    now: datetime,
    retry: RetryPolicy,
    message: str,
    worker_id: str,
    data: dict[str, Any],
    errors: dict[str, Any],
) -> bool:
    """running -> retrying, due after the backoff; False when the compare-and-set was lost."""
    ceiling, delay = retry.backoff(job.attempt)
    due = now + timedelta(seconds=delay)
    if not compare_and_set(
        session,
        job,
        ON_LEASE,
        bound={"w_lease": lease},
        status=JobStatus.retrying,
        next_attempt_at=due,
        worker_id=None,
        waiting_for=None,
        waiting_since=None,
        **errors,
    ):
        return False
    data.update(delay=round(delay, 3), ceiling=ceiling, due=due.isoformat())
    add_event(
        session,
        job,
        "attempt_failed",
        actor=worker_id,
        from_status=JobStatus.running,
        to_status=JobStatus.retrying,
        data=data,
        message=f"{message}; retry {job.attempt + 1}/{job.max_attempts} in {delay:.1f}s",
    )
    publish(session, job, due)
    return True


def _dead_letter(
    session: Session,
    job: Job,
    lease: int,
    *,
    now: datetime,
    worker_id: str,
    data: dict[str, Any],
    errors: dict[str, Any],
) -> bool:
    """running -> failed (a dead letter); False when the compare-and-set was lost."""
    if not compare_and_set(
        session,
        job,
        ON_LEASE,
        bound={"w_lease": lease},
        status=JobStatus.failed,
        finished_at=now,
        worker_id=None,
        next_attempt_at=None,
        waiting_for=None,
        **errors,
    ):
        return False
    logged = add_event(
        session,
        job,
        "failed",
        actor=worker_id,
        from_status=JobStatus.running,
        to_status=JobStatus.failed,
        data=data,
        message=errors["error_message"],
    )
    webhook_records.record(session, job, "job.failed", logged=logged)
    return True


def _wait(
    session: Session,
    job: Job,
    *,
    now: datetime,
    since: datetime,
    wait: WaitPolicy,
    retry: RetryPolicy,
    worker_id: str,
    data: dict[str, Any],
    errors: dict[str, Any],
) -> Job | None:
    """running -> retrying without spending the attempt: something the job needs is missing."""
    delay = retry.poll(wait.poll_seconds)
    due = now + timedelta(seconds=delay)
    message = f"waiting for {wait.waiting_for}: {errors['error_message']}"
    errors["error_message"] = message
    if not compare_and_set(
        session,
        job,
        ON_LEASE,
        bound={"w_lease": job.lease},
        status=JobStatus.retrying,
        attempt=job.attempt - 1,
        next_attempt_at=due,
        worker_id=None,
        waiting_for=wait.waiting_for,
        waiting_since=since,
        now=now,
        **errors,
    ):
        session.rollback()
        return None
    data.update(
        delay=round(delay, 3),
        due=due.isoformat(),
        waiting_for=wait.waiting_for,
        waiting_since=since.isoformat(),
    )
    add_event(
        session,
        job,
        "waiting",
        actor=worker_id,
        from_status=JobStatus.running,
        to_status=JobStatus.retrying,
        data=data,
        message=f"{message}; attempt not counted; looking again in {delay:.1f}s",
    )
    publish(session, job, due)
    session.commit()
    return job


def cancelled(session: Session, job: Job, *, actor: str, **extra: Any) -> Job | None:
    """The job -> cancelled, by compare-and-set, committed; ``extra`` adds to its error columns."""
    where_text = describe_progress(job.stage, job.done, job.total)
    before = job.status
    msg = f"cancelled at {where_text}"
    now = db_now(session)
    if not compare_and_set(
        session,
        job,
        status=JobStatus.cancelled,
        finished_at=now,
        cancel_requested=False,
        now=now,
        worker_id=None,
        next_attempt_at=None,
        **{
            "error_message": msg,
            "error_code": "cancelled",
            "error_kind": None,
            "fix_hint": None,
            "waiting_for": None,
            **extra,
        },
    ):
        session.rollback()
        return None
    logged = add_event(
        session,
        job,
        "cancelled",
        actor=actor,
        from_status=before,
        to_status=JobStatus.cancelled,
        message=msg,
        data={"stage": value_of(job.stage), "done": job.done, "total": job.total},
    )
    webhook_records.record(session, job, "job.cancelled", logged=logged)
    session.commit()
    return job


def acknowledge_cancel(*, session: Session, job_id: int, lease: int, worker_id: str) -> Job | None:
    """The worker stopped a running job after cancel was requested (vectors already removed)."""

    def once() -> Job | None:
        job = get_job(session=session, job_id=job_id)
        if job is None or job.lease != lease or job.status != JobStatus.running:
            return None
        return cancelled(session, job, actor=worker_id)

    return while_ours(session, job_id, lease, once)


def hand_back(
    *, session: Session, job_id: int, lease: int, worker_id: str, reason: str
) -> Job | None:
    """running -> pending, the attempt not counted: the worker is stopping in order and gives the
    job back instead of finishing it (what the attempt wrote stays: the next one skips those ids).
    None when the job is no longer this lease's, or a cancel is waiting (the reaper carries it
    out, removing the attempt's chunks)."""
    job = get_job(session=session, job_id=job_id)
    session.rollback()
    if job is not None and job.cancel_requested:
        return None
    return while_ours(
        session, job_id, lease, lambda: _hand_back_once(session, job_id, lease, worker_id, reason)
    )


def _hand_back_once(
    session: Session, job_id: int, lease: int, worker_id: str, reason: str
) -> Job | None:
    """One try of ``hand_back``."""
    job = get_job(session=session, job_id=job_id)
    if job is None or job.lease != lease or job.status != JobStatus.running:
        return None
    if job.cancel_requested:
        return None
    now = db_now(session)
    where = describe_progress(job.stage, job.done, job.total)
    if not compare_and_set(
        session,
        job,
        RUNNING_ON_LEASE,
        bound={"w_lease": lease},
        status=JobStatus.pending,
        stage=Stage.queued,
        done=0,
        total=0,
        attempt=max(0, job.attempt - 1),
        worker_id=None,
        next_attempt_at=None,
        now=now,
    ):
        session.rollback()
        return None
    add_event(
        session,
        job,
        "handed_back",
        actor=worker_id,
        from_status=JobStatus.running,
        to_status=JobStatus.pending,
        message=f"{reason}; handed back at {where}, attempt not counted",
        data={"lease": lease},
    )
    publish(session, job, now)
    session.commit()
    return job
