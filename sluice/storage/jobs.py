"""The job state machine: every transition of a job lives here.

Every update is compare-and-set: on ``version`` for operator and claim transitions, and on the
fencing token ``lease`` (plus status running) for what a worker writes during its attempt. A
transition that loses the race changes nothing and says so. Each transition writes a JobEvent in
the same transaction; transitions that need the job published again write an Outbox row too.

    pending ──claim──▶ running ──succeed──▶ succeeded ──reindex──▶ pending
       ▲                 │ fail(transient, budget left) ▶ retrying ──claim──▶ running
       │                 │ fail(otherwise) ▶ failed (dead letter) ──retry──▶ pending
       │                 │ cancel_requested ▶ cancelled ──retry──▶ pending
       └── retry ────────┘ reaper: heartbeat older than the lease = transient failure
    succeeded ──a newer pipeline version of the document succeeds──▶ superseded ──revive──▶ pending
    any ──mark_deleted (the document is deleted)──▶ deleted ──the same bytes uploaded again──▶ pending
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import update
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, select

from sluice.errors import LeaseLost
from sluice.storage.models import (
    STAGE_UNITS,
    Document,
    ErrorKind,
    Job,
    JobEvent,
    JobStatus,
    Outbox,
    Stage,
    utcnow,
)

CLAIMABLE = (JobStatus.pending, JobStatus.retrying)
RETRYABLE = (JobStatus.failed, JobStatus.cancelled)
CANCELLABLE = (JobStatus.pending, JobStatus.retrying, JobStatus.running)


@dataclass(frozen=True)
class ClaimResult:
    job: Job | None
    claimed: bool
    reason: str = ""


@dataclass(frozen=True)
class ActionResult:
    job_id: int
    ok: bool
    message: str


def describe_progress(stage: Stage | str, done: int, total: int) -> str:
    stage = Stage(stage)
    unit = STAGE_UNITS.get(stage)
    if unit and total:
        return f"{stage.value} {done}/{total} {unit}"
    return stage.value


def backoff_delay(attempt: int, *, base: float, cap: float, rng: random.Random | None = None) -> tuple[float, float]:
    """Exponential backoff with full jitter: returns (ceiling, drawn delay) for a failed attempt."""
    ceiling = min(cap, base * (2 ** max(0, attempt - 1)))
    return ceiling, (rng or random).uniform(0, ceiling)


def add_event(
    session: Session,
    job: Job,
    kind: str,
    *,
    message: str = "",
    actor: str = "system",
    from_status: JobStatus | str | None = None,
    to_status: JobStatus | str | None = None,
    data: dict[str, Any] | None = None,
) -> JobEvent:
    event = JobEvent(
        job_id=job.id,
        kind=kind,
        message=message,
        actor=actor,
        from_status=_val(from_status),
        to_status=_val(to_status),
        stage=_val(job.stage),
        attempt=job.attempt,
        data=data or {},
    )
    session.add(event)
    return event


def _val(v: Any) -> Any:
    return v.value if hasattr(v, "value") else v


def _cas(session: Session, job: Job, *, where: Sequence[Any] = (), **values: Any) -> bool:
    """Update ``job`` only if its version is still the one we read; refresh the object on success."""
    now = utcnow()
    values.setdefault("updated_at", now)
    stmt = (
        update(Job)
        .where(Job.id == job.id, Job.version == job.version, *where)
        .values(version=job.version + 1, **values)
        .execution_options(synchronize_session=False)
    )
    result = session.execute(stmt)
    if result.rowcount != 1:
        return False
    for key, value in values.items():
        setattr(job, key, value)
    job.version += 1
    return True


def _fenced(session: Session, job_id: int, lease: int, **values: Any) -> bool:
    """Update a running job only while ``lease`` still owns it."""
    values.setdefault("updated_at", utcnow())
    stmt = (
        update(Job)
        .where(Job.id == job_id, Job.lease == lease, Job.status == JobStatus.running)
        .values(version=Job.version + 1, **values)
        .execution_options(synchronize_session=False)
    )
    return session.execute(stmt).rowcount == 1


def _publish(session: Session, job: Job, at: datetime | None = None) -> None:
    session.add(Outbox(job_id=job.id, available_at=at or utcnow()))


def get_job(*, session: Session, job_id: int) -> Job | None:
    return session.get(Job, job_id, populate_existing=True)


def idempotency_key(*, dataset_id: int, sha256: str, pipeline_version: str) -> str:
    """One job per bytes, dataset and pipeline version: an upload of the same file again finds it."""
    return f"{dataset_id}:{sha256}:{pipeline_version}"


# --- creation ------------------------------------------------------------------------------------


def create_job(
    *,
    session: Session,
    document: Document,
    pipeline_version: str,
    idempotency_key: str,
    max_attempts: int,
    actor: str = "system",
) -> tuple[Job, bool]:
    """Job(pending) + Outbox + JobEvent for a document, or the existing job for the same key.

    The caller commits; the three rows land in one transaction with the Document.
    """
    existing = session.exec(select(Job).where(Job.idempotency_key == idempotency_key)).first()
    if existing is not None:
        if existing.status == JobStatus.deleted:
            # The same bytes uploaded again after a delete: bring the job back.
            before = existing.status
            if _cas(session, existing, status=JobStatus.pending, stage=Stage.queued, done=0, total=0,
                    attempt=0, max_attempts=max_attempts, next_attempt_at=None, finished_at=None,
                    cancel_requested=False, dismissed=False, error_kind=None, error_code=None,
                    error_message=None, fix_hint=None, error_detail=None):
                add_event(session, existing, "reuploaded", actor=actor, from_status=before,
                          to_status=JobStatus.pending, message="uploaded again after delete")
                _publish(session, existing)
                return existing, True
        return existing, False
    job = Job(
        document_id=document.id,
        dataset_id=document.dataset_id,
        filename=document.filename,
        idempotency_key=idempotency_key,
        pipeline_version=pipeline_version,
        max_attempts=max_attempts,
    )
    session.add(job)
    session.flush()
    add_event(session, job, "created", actor=actor, to_status=JobStatus.pending,
              message=f"{document.filename} ({document.size} bytes, {document.media_type})")
    _publish(session, job)
    return job, True


# --- the worker's side -----------------------------------------------------------------------------


def claim(*, session: Session, job_id: int, worker_id: str, lease_seconds: float) -> ClaimResult:
    """pending/retrying -> running, or a recorded no-op saying why not."""
    job = get_job(session=session, job_id=job_id)
    if job is None:
        return ClaimResult(None, False, "no such job")
    now = utcnow()
    reason = ""
    if job.status in JobStatus.final():
        reason = f"delivery ignored: job is already {job.status.value}"
    elif job.status == JobStatus.running:
        fresh = job.heartbeat_at and job.heartbeat_at > now - timedelta(seconds=lease_seconds)
        reason = (
            f"delivery ignored: already running on {job.worker_id}"
            if fresh
            else "delivery ignored: running with a stale heartbeat; the reaper takes it back"
        )
    elif job.status == JobStatus.retrying and job.next_attempt_at and job.next_attempt_at > now + timedelta(seconds=1):
        reason = f"delivery ignored: next attempt is due at {job.next_attempt_at:%H:%M:%S}"
    if reason:
        add_event(session, job, "noop", message=reason, actor=worker_id)
        session.commit()
        return ClaimResult(job, False, reason)
    before = job.status
    ok = _cas(
        session, job, where=[Job.status.in_(CLAIMABLE)],
        status=JobStatus.running, stage=Stage.parsing, done=0, total=0,
        attempt=job.attempt + 1, lease=job.lease + 1, worker_id=worker_id,
        heartbeat_at=now, started_at=job.started_at or now, next_attempt_at=None,
        embedded_count=0, cached_count=0,
    )
    if not ok:
        session.rollback()
        job = get_job(session=session, job_id=job_id)
        reason = f"delivery ignored: claimed concurrently (now {job.status.value})"
        add_event(session, job, "noop", message=reason, actor=worker_id)
        session.commit()
        return ClaimResult(job, False, reason)
    add_event(session, job, "claimed", actor=worker_id, from_status=before, to_status=JobStatus.running,
              message=f"attempt {job.attempt} of {job.max_attempts}", data={"lease": job.lease})
    session.commit()
    return ClaimResult(job, True)


def progress(*, session: Session, job_id: int, lease: int, stage: Stage, done: int, total: int,
             **extra: Any) -> bool:
    """Write stage counts and the heartbeat; return cancel_requested. LeaseLost if not ours."""
    ok = _fenced(session, job_id, lease, stage=stage, done=done, total=total, heartbeat_at=utcnow(), **extra)
    if not ok:
        session.rollback()
        raise LeaseLost(f"job {job_id} is no longer owned by lease {lease}")
    cancel = session.execute(select(Job.cancel_requested).where(Job.id == job_id)).scalar_one()
    session.commit()
    return bool(cancel)


def heartbeat(*, session: Session, job_id: int, lease: int) -> bool:
    ok = _fenced(session, job_id, lease, heartbeat_at=utcnow())
    session.commit()
    return ok


def succeed(*, session: Session, job_id: int, lease: int, chunk_count: int, page_count: int,
            worker_id: str, embedded: int, cached: int, warnings: Sequence[str] = (),
            stages: dict[str, float] | None = None) -> int | None:
    """running -> succeeded; makes this job the document's searchable one. Each warning (a page
    skipped, a file that needed repair) is a ``warning`` event of the job; ``stages`` (seconds per
    stage) go into the success event.

    Returns the id of the job it supersedes (an older pipeline version whose chunks the caller
    removes), or None.
    """
    now = utcnow()
    ok = _fenced(
        session, job_id, lease, status=JobStatus.succeeded, stage=Stage.done, done=chunk_count,
        total=chunk_count, chunk_count=chunk_count, page_count=page_count, finished_at=now,
        heartbeat_at=now, cancel_requested=False, error_kind=None, error_code=None,
        error_message=None, fix_hint=None, error_detail=None, embedded_count=embedded, cached_count=cached,
    )
    if not ok:
        session.rollback()
        raise LeaseLost(f"job {job_id} is no longer owned by lease {lease}")
    job = get_job(session=session, job_id=job_id)
    add_event(session, job, "succeeded", actor=worker_id, from_status=JobStatus.running,
              to_status=JobStatus.succeeded,
              message=f"{chunk_count} chunks from {page_count} pages ({embedded} embedded, {cached} from cache)",
              data={"chunks": chunk_count, "pages": page_count, "embedded": embedded, "cached": cached,
                    "warnings": len(warnings), "stages": stages or {}})
    for text in warnings:
        add_event(session, job, "warning", actor=worker_id, message=text)
    document = session.get(Document, job.document_id, populate_existing=True)
    superseded = None
    if document.active_job_id not in (None, job.id):
        old = get_job(session=session, job_id=document.active_job_id)
        if old is not None and old.status == JobStatus.succeeded:
            _cas(session, old, status=JobStatus.superseded)
            add_event(session, old, "superseded", from_status=JobStatus.succeeded,
                      to_status=JobStatus.superseded,
                      message=f"job {job.id} (pipeline {job.pipeline_version}) now serves search")
            superseded = old.id
    document.active_job_id = job.id
    document.deleted_at = None
    session.add(document)
    session.commit()
    return superseded


CAS_TRIES = 5  # a worker's own concurrent write (heartbeat, progress) moves the version this often at most


def fail(*, session: Session, job_id: int, lease: int, kind: ErrorKind, code: str, message: str,
         hint: str, detail: str, worker_id: str, base_delay: float, max_delay: float,
         rng: random.Random | None = None, page_count: int | None = None) -> Job | None:
    """End a failed attempt: retrying with backoff (transient, budget left) or failed (dead letter).
    ``page_count``, when the attempt got as far as counting pages, is kept on the job.

    The compare-and-set is tried again when the version moved but the job is still this lease's
    running job: the attempt's own heartbeat or progress write may land between the read and the
    write, and must not make the failure disappear (the job would run on until the reaper)."""
    for _ in range(CAS_TRIES):
        job = get_job(session=session, job_id=job_id)
        if job is None or job.lease != lease or job.status != JobStatus.running:
            return None
        ended = _fail_once(session, job, lease=lease, kind=kind, code=code, message=message, hint=hint,
                           detail=detail, worker_id=worker_id, base_delay=base_delay, max_delay=max_delay,
                           rng=rng, page_count=page_count)
        if ended is not None:
            return ended
        session.rollback()
    return None


def _fail_once(session: Session, job: Job, *, lease: int, kind: ErrorKind, code: str, message: str, hint: str,
               detail: str, worker_id: str, base_delay: float, max_delay: float, rng: random.Random | None,
               page_count: int | None) -> Job | None:
    errors = dict(error_kind=kind, error_code=code, error_message=message, fix_hint=hint,
                  error_detail=detail[-8000:] if detail else None)
    if page_count is not None:
        errors["page_count"] = page_count
    if job.cancel_requested:
        return _cancelled(session, job, actor=worker_id, **errors)
    now = utcnow()
    data: dict[str, Any] = {"code": code, "kind": kind.value}
    if kind == ErrorKind.transient and job.attempt < job.max_attempts:
        ceiling, delay = backoff_delay(job.attempt, base=base_delay, cap=max_delay, rng=rng)
        due = now + timedelta(seconds=delay)
        if not _cas(session, job, where=[Job.lease == lease], status=JobStatus.retrying,
                    next_attempt_at=due, worker_id=None, **errors):
            return None
        data.update(delay=round(delay, 3), ceiling=ceiling, due=due.isoformat())
        add_event(session, job, "attempt_failed", actor=worker_id, from_status=JobStatus.running,
                  to_status=JobStatus.retrying, data=data,
                  message=f"{message}; retry {job.attempt + 1}/{job.max_attempts} in {delay:.1f}s")
        _publish(session, job, due)
    else:
        if kind == ErrorKind.transient:
            errors["error_message"] = f"gave up after {job.attempt} attempts: {message}"
        if not _cas(session, job, where=[Job.lease == lease], status=JobStatus.failed,
                    finished_at=now, worker_id=None, next_attempt_at=None, **errors):
            return None
        add_event(session, job, "failed", actor=worker_id, from_status=JobStatus.running,
                  to_status=JobStatus.failed, data=data, message=errors["error_message"])
    session.commit()
    return job


def _cancelled(session: Session, job: Job, *, actor: str, **extra: Any) -> Job | None:
    where_text = describe_progress(job.stage, job.done, job.total)
    before = job.status
    msg = f"cancelled at {where_text}"
    if not _cas(session, job, status=JobStatus.cancelled, finished_at=utcnow(), cancel_requested=False,
                worker_id=None, next_attempt_at=None,
                **{"error_message": msg, "error_code": "cancelled", "error_kind": None, "fix_hint": None, **extra}):
        session.rollback()
        return None
    add_event(session, job, "cancelled", actor=actor, from_status=before, to_status=JobStatus.cancelled,
              message=msg, data={"stage": _val(job.stage), "done": job.done, "total": job.total})
    session.commit()
    return job


def acknowledge_cancel(*, session: Session, job_id: int, lease: int, worker_id: str) -> Job | None:
    """The worker stopped a running job after cancel was requested (vectors already removed); tried
    again, like ``fail``, when the attempt's own heartbeat moved the version in between."""
    for _ in range(CAS_TRIES):
        job = get_job(session=session, job_id=job_id)
        if job is None or job.lease != lease or job.status != JobStatus.running:
            return None
        done = _cancelled(session, job, actor=worker_id)
        if done is not None:
            return done
    return None


def reap(*, session: Session, lease_seconds: float, base_delay: float, max_delay: float,
         now: datetime | None = None) -> list[int]:
    """Take back running jobs whose heartbeat is older than the lease; returns their ids.

    Only running jobs have heartbeats; a job waiting in the queue is pending or retrying and is
    never touched here.
    """
    cutoff = (now or utcnow()) - timedelta(seconds=lease_seconds)
    stale = session.exec(
        select(Job).where(Job.status == JobStatus.running, Job.heartbeat_at < cutoff)
    ).all()
    taken = []
    for job in stale:
        silent = (utcnow() - job.heartbeat_at).total_seconds()
        result = fail(
            session=session, job_id=job.id, lease=job.lease, kind=ErrorKind.transient,
            code="worker_lost",
            message=f"worker {job.worker_id} stopped answering during {describe_progress(job.stage, job.done, job.total)} "
                    f"(no heartbeat for {silent:.0f}s)",
            hint="Sluice retries this by itself. If workers keep dying, check their logs and memory.",
            detail="", worker_id="reaper", base_delay=base_delay, max_delay=max_delay,
        )
        if result is not None:
            taken.append(job.id)
    return taken


# --- the operator's side -----------------------------------------------------------------------------


def _load_many(session: Session, job_ids: Iterable[int]) -> list[tuple[int, Job | None]]:
    return [(jid, get_job(session=session, job_id=jid)) for jid in job_ids]


def request_cancel(*, session: Session, job_ids: Iterable[int], actor: str) -> list[ActionResult]:
    results = []
    for jid, job in _load_many(session, job_ids):
        if job is None:
            results.append(ActionResult(jid, False, f"job {jid} does not exist"))
        elif job.status in (JobStatus.pending, JobStatus.retrying):
            done = _cancelled(session, job, actor=actor)
            results.append(ActionResult(jid, done is not None,
                                        f"job {jid} cancelled before it ran" if done else f"job {jid} changed meanwhile; try again"))
        elif job.status == JobStatus.running:
            if job.cancel_requested:
                results.append(ActionResult(jid, True, f"job {jid}: cancel already requested"))
                continue
            ok = _cas(session, job, where=[Job.status == JobStatus.running], cancel_requested=True)
            if ok:
                add_event(session, job, "cancel_requested", actor=actor,
                          message=f"cancel requested at {describe_progress(job.stage, job.done, job.total)}")
            session.commit()
            results.append(ActionResult(jid, ok, f"job {jid} is running; it stops at its next batch"
                                        if ok else f"job {jid} changed meanwhile; try again"))
        else:
            results.append(ActionResult(jid, False, f"job {jid} is {job.status.value}; only pending, "
                                        "retrying or running jobs can be cancelled"))
    return results


def retry(*, session: Session, job_ids: Iterable[int], actor: str, reason: str = "manual retry") -> list[ActionResult]:
    """failed/cancelled -> pending with a fresh attempt budget, published again."""
    results = []
    for jid, job in _load_many(session, job_ids):
        if job is None:
            results.append(ActionResult(jid, False, f"job {jid} does not exist"))
            continue
        if job.status == JobStatus.succeeded:
            results.append(ActionResult(jid, False, f"job {jid} has already succeeded; retry refused. "
                                        "Use reindex to rebuild its chunks on purpose."))
            continue
        if job.status not in RETRYABLE:
            results.append(ActionResult(jid, False, f"job {jid} is {job.status.value}; only failed or "
                                        "cancelled jobs can be retried"))
            continue
        before = job.status
        ok = _cas(session, job, where=[Job.status.in_(RETRYABLE)], status=JobStatus.pending, stage=Stage.queued,
                  done=0, total=0, attempt=0, next_attempt_at=None, finished_at=None, dismissed=False,
                  cancel_requested=False, error_kind=None, error_code=None, error_message=None,
                  fix_hint=None, error_detail=None)
        if ok:
            add_event(session, job, "retried", actor=actor, from_status=before, to_status=JobStatus.pending,
                      message=reason)
            _publish(session, job)
        session.commit()
        results.append(ActionResult(jid, ok, f"job {jid} queued again ({reason})" if ok
                                    else f"job {jid} changed meanwhile; try again"))
    return results


def reindex(*, session: Session, job_ids: Iterable[int], actor: str, reason: str = "reindex") -> list[ActionResult]:
    """succeeded -> pending: rebuild the same chunks on purpose; search keeps serving the old ones."""
    results = []
    for jid, job in _load_many(session, job_ids):
        if job is None or job.status != JobStatus.succeeded:
            state = "does not exist" if job is None else f"is {job.status.value}"
            results.append(ActionResult(jid, False, f"job {jid} {state}; only succeeded jobs can be reindexed"))
            continue
        ok = _cas(session, job, where=[Job.status == JobStatus.succeeded], status=JobStatus.pending,
                  stage=Stage.queued, done=0, total=0, attempt=0, finished_at=None)
        if ok:
            add_event(session, job, "reindex_requested", actor=actor, from_status=JobStatus.succeeded,
                      to_status=JobStatus.pending, message=reason)
            _publish(session, job)
        session.commit()
        results.append(ActionResult(jid, ok, f"job {jid} queued for reindex" if ok else f"job {jid} changed meanwhile"))
    return results


def dismiss(*, session: Session, job_ids: Iterable[int], actor: str) -> list[ActionResult]:
    """Hide a dead letter from the dead-letter list (it stays failed, with its history)."""
    results = []
    for jid, job in _load_many(session, job_ids):
        if job is None or job.status != JobStatus.failed:
            results.append(ActionResult(jid, False, f"job {jid} is not a dead letter"))
            continue
        ok = _cas(session, job, where=[Job.status == JobStatus.failed], dismissed=True)
        if ok:
            add_event(session, job, "dismissed", actor=actor, message="dismissed from dead letters")
        session.commit()
        results.append(ActionResult(jid, ok, f"job {jid} dismissed" if ok else f"job {jid} changed meanwhile"))
    return results


# --- integrity: pipeline versions and delete ---------------------------------------------------------


def revive(*, session: Session, job_ids: Iterable[int], actor: str,
           reason: str = "pipeline version in force again") -> list[ActionResult]:
    """superseded -> pending: the settings went back to this job's pipeline version, so build it
    again (its chunks were removed when it was superseded). Search keeps serving the document's
    active job until this one succeeds and takes over."""
    results = []
    for jid, job in _load_many(session, job_ids):
        if job is None or job.status != JobStatus.superseded:
            state = "does not exist" if job is None else f"is {job.status.value}"
            results.append(ActionResult(jid, False, f"job {jid} {state}; only superseded jobs can be revived"))
            continue
        ok = _cas(session, job, where=[Job.status == JobStatus.superseded], status=JobStatus.pending,
                  stage=Stage.queued, done=0, total=0, attempt=0, finished_at=None, next_attempt_at=None,
                  cancel_requested=False)
        if ok:
            add_event(session, job, "revived", actor=actor, from_status=JobStatus.superseded,
                      to_status=JobStatus.pending, message=reason)
            _publish(session, job)
        session.commit()
        results.append(ActionResult(jid, ok, f"job {jid} queued to build pipeline {job.pipeline_version} again"
                                    if ok else f"job {jid} changed meanwhile"))
    return results




def mark_deleted(*, session: Session, document_id: int, actor: str, reason: str = "document deleted",
                 attempts: int = 5) -> list[ActionResult]:
    """Every job of a document -> deleted, and the document -> deleted_at, in one transaction.

    Jobs and their events stay (the audit trail); search stops answering the document at once. A
    running job loses its fence: its worker's next write fails and it stops. The caller removes the
    vectors and the blob afterwards. A compare-and-set that loses to a worker's write is tried again.
    """
    for _ in range(attempts):
        document = session.get(Document, document_id, populate_existing=True)
        if document is None:
            return [ActionResult(0, False, f"document {document_id} does not exist")]
        rows = session.exec(select(Job).where(Job.document_id == document_id).order_by(Job.id)
                            .execution_options(populate_existing=True)).all()
        now = utcnow()
        results, lost = [], False
        for job in rows:
            if job.status == JobStatus.deleted:
                results.append(ActionResult(job.id, True, f"job {job.id} was already deleted"))
                continue
            before = job.status
            if not _cas(session, job, status=JobStatus.deleted, cancel_requested=False, worker_id=None,
                        next_attempt_at=None, finished_at=job.finished_at or now):
                lost = True
                break
            add_event(session, job, "deleted", actor=actor, from_status=before, to_status=JobStatus.deleted,
                      message=reason, data={"document_id": document_id,
                                            "was_active": document.active_job_id == job.id})
            results.append(ActionResult(job.id, True, f"job {job.id} deleted (was {before.value})"))
        if lost:
            session.rollback()
            continue
        document.deleted_at = document.deleted_at or now
        document.active_job_id = None
        session.add(document)
        session.commit()
        return results
    return [ActionResult(0, False, f"document {document_id}: its jobs kept changing; try again")]


# --- versions ----------------------------------------------------------------------------------------

ACTION_FOR_STATUS = {
    None: "create",
    JobStatus.failed: "retry",
    JobStatus.cancelled: "retry",
    JobStatus.superseded: "revive",
    JobStatus.succeeded: "reindex",  # built once, but an older job took search back; build it again
    JobStatus.deleted: "create",  # create_job brings a deleted job of a live document back
    JobStatus.pending: "underway",
    JobStatus.running: "underway",
    JobStatus.retrying: "underway",
}


def ensure_version_job(*, session: Session, document: Document, pipeline_version: str, max_attempts: int,
                       actor: str, reason: str) -> tuple[ActionResult, bool]:
    """Make sure a job of ``pipeline_version`` is queued for ``document``; returns the
    result and whether this call queued it.

    Creates the job (committing), or retries / revives / rebuilds the one that exists; a job
    already under way is left alone (ok, nothing queued).
    """
    version = pipeline_version
    key = idempotency_key(dataset_id=document.dataset_id, sha256=document.sha256, pipeline_version=version)
    existing = session.exec(select(Job).where(Job.idempotency_key == key)).first()
    status = existing.status if existing is not None else None
    action = ACTION_FOR_STATUS[status]
    if action == "underway":
        return ActionResult(existing.id, True, f"job {existing.id} of pipeline {version} is already "
                                               f"{status.value}"), False
    transition = {"retry": retry, "revive": revive, "reindex": reindex}.get(action)
    if transition is not None:
        [result] = transition(session=session, job_ids=[existing.id], actor=actor, reason=reason)
        return result, result.ok
    try:
        job, created = create_job(session=session, document=document, pipeline_version=version,
                                       idempotency_key=key, max_attempts=max_attempts, actor=actor)
        if created:
            add_event(session, job, "reindex_requested", actor=actor, to_status=JobStatus.pending,
                           message=reason, data={"pipeline_version": version,
                                                 "replaces_job": document.active_job_id})
        session.commit()
    except IntegrityError:  # another reindex created it at the same moment
        session.rollback()
        return ActionResult(0, True, f"document {document.id}: a job of pipeline {version} was just created"), False
    return ActionResult(job.id, True, f"job {job.id} queued to build {document.filename} with pipeline "
                                      f"{version}"), created


def action_rejected(*, session: Session, job_id: int, actor: str, code: str, message: str, hint: str) -> bool:
    """A failed job whose fix the operator tried, and that fix did not work (a wrong password): it
    stays failed as user_action_required, and its error now says why. False if it is not failed."""
    job = get_job(session=session, job_id=job_id)
    if job is None or job.status != JobStatus.failed:
        return False
    ok = _cas(session, job, where=[Job.status == JobStatus.failed], error_kind=ErrorKind.user_action_required,
              error_code=code, error_message=message, fix_hint=hint, error_detail=None)
    if ok:
        add_event(session, job, "action_rejected", actor=actor, message=message, data={"code": code})
    session.commit()
    return ok
