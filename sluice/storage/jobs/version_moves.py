"""Jobs and pipeline versions: a job of the version in force, queued, restamped or followed.

A dataset's settings change makes a new pipeline version; its jobs of the old one build the new
one instead, or are left to be superseded by the new version's job when it succeeds.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from sluice.storage.clock import db_now
from sluice.storage.db import stored
from sluice.storage.jobs.conditional import (
    IN_STATUS,
    IN_STATUS_OF_VERSION,
    RUNNING_ON_LEASE,
    compare_and_set,
)
from sluice.storage.jobs.creation import create_job, idempotency_key
from sluice.storage.jobs.event_log import add_event
from sluice.storage.jobs.job_values import ActionResult
from sluice.storage.jobs.lookups import get_job
from sluice.storage.jobs.operator_actions import reindex, retry, revive
from sluice.storage.jobs.outbox_row import publish
from sluice.storage.jobs.statuses import RESTAMPABLE
from sluice.storage.models import Document, Job, JobEvent, JobStatus, Stage

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


def ensure_version_job(
    *,
    session: Session,
    document: Document,
    pipeline_version: str,
    max_attempts: int,
    actor: str,
    reason: str,
) -> tuple[ActionResult, bool]:
    """Make sure a job of ``pipeline_version`` is queued for ``document``; returns the
    result and whether this call queued it.

    Creates the job (committing), or retries / revives / rebuilds the one that exists; a job
    already under way is left alone (ok, nothing queued).
    """
    version = pipeline_version
    key = idempotency_key(
        dataset_id=document.dataset_id, sha256=document.sha256, pipeline_version=version
    )
    existing = session.exec(select(Job).where(Job.idempotency_key == key)).first()
    status = existing.status if existing is not None else None
    action = ACTION_FOR_STATUS[status]
    if existing is not None and action == "underway":  # status None is "create"
        return ActionResult(
            existing.id,
            True,
            f"job {existing.id} of pipeline {version} is already {existing.status.value}",
        ), False
    transition = {"retry": retry, "revive": revive, "reindex": reindex}.get(action)
    if existing is not None and transition is not None:
        [result] = transition(session=session, job_ids=[existing.id], actor=actor, reason=reason)
        return result, result.ok
    try:
        job, created = create_job(
            session=session,
            document=document,
            pipeline_version=version,
            idempotency_key=key,
            max_attempts=max_attempts,
            actor=actor,
        )
        if created:
            add_event(
                session,
                job,
                "reindex_requested",
                actor=actor,
                to_status=JobStatus.pending,
                message=reason,
                data={"pipeline_version": version, "replaces_job": document.active_job_id},
            )
        session.commit()
    except IntegrityError:  # another reindex created it at the same moment
        session.rollback()
        return ActionResult(
            0, True, f"document {document.id}: a job of pipeline {version} was just created"
        ), False
    return ActionResult(
        job.id, True, f"job {job.id} queued to build {document.filename} with pipeline {version}"
    ), created


def restamp(
    *, session: Session, dataset_id: int, from_version: str, to_version: str, actor: str
) -> list[int]:
    """The dataset's parse settings changed from those making ``from_version`` to those making
    ``to_version``: its jobs of the old version that are not running (waiting, due for a retry, or
    dead letters) build the new version instead, or no worker would ever take them. Each by
    compare-and-set; one whose document already has a job of the new version is left alone (that
    job supersedes it when it succeeds). A job running now finishes on the old version; the
    dataset's reindex then rebuilds its document. Returns the ids restamped.

    A job that is its document's active one is never restamped: search serves its chunks under its
    version, and a re-run under another version would write chunks of both under one job id. A
    rebuild of it that waits (a reindex, a repair's rebuild, a failed attempt of one) is dropped
    instead: the job is succeeded again and a job of the new version is queued for the document
    (also when the active job is running its rebuild now)."""
    done: list[int] = []
    if from_version == to_version:
        return done
    found = session.exec(
        select(Job)
        .where(
            Job.dataset_id == dataset_id,
            Job.pipeline_version == from_version,
            col(Job.status).in_((*RESTAMPABLE, JobStatus.running)),
        )
        .order_by(col(Job.id))
    ).all()
    for job in found:
        document = stored(session, Document, job.document_id)
        key = idempotency_key(
            dataset_id=dataset_id, sha256=document.sha256, pipeline_version=to_version
        )
        if document.active_job_id == job.id:
            _replace_rebuild(session, job, document, to_version=to_version, key=key, actor=actor)
            continue
        if job.status == JobStatus.running:
            continue
        if session.exec(select(Job.id).where(Job.idempotency_key == key)).first() is not None:
            continue
        if _restamp_one(
            session, job, from_version=from_version, to_version=to_version, key=key, actor=actor
        ):
            done.append(job.id)
    return done


def _restamp_one(
    session: Session, job: Job, *, from_version: str, to_version: str, key: str, actor: str
) -> bool:
    status = job.status
    try:
        ok = compare_and_set(
            session,
            job,
            IN_STATUS_OF_VERSION,
            bound={"w_status": status, "w_version": from_version},
            pipeline_version=to_version,
            idempotency_key=key,
        )
        if ok:
            add_event(
                session,
                job,
                "restamped",
                actor=actor,
                message="the dataset's parse settings changed: this job builds pipeline "
                f"{to_version} instead of {from_version}",
                data={"from_version": from_version, "to_version": to_version},
            )
        session.commit()
        return ok
    except IntegrityError:  # a job of the new version was just made for this document
        session.rollback()
        return False


def _replace_rebuild(
    session: Session, job: Job, document: Document, *, to_version: str, key: str, actor: str
) -> None:
    """The document's active job was to be rebuilt on a version no longer in force: it serves its
    chunks again as succeeded (unless it is running that rebuild now: then the new version's job
    supersedes it), and a job of ``to_version`` is queued for the document."""
    if job.status != JobStatus.running and not _drop_rebuild(session, job, to_version, actor):
        session.rollback()
        return
    try:
        create_job(
            session=session,
            document=document,
            pipeline_version=to_version,
            idempotency_key=key,
            max_attempts=job.max_attempts,
            actor=actor,
        )
        session.commit()
    except IntegrityError:  # another change or reindex queued it at the same moment
        session.rollback()


def _drop_rebuild(
    session: Session,
    job: Job,
    to_version: str,
    actor: str,
    because: str = "the dataset's parse settings changed",
) -> bool:
    """The active job's waiting rebuild dropped: it is succeeded again and serves its chunks, by
    compare-and-set (the caller commits). False when the job changed meanwhile."""
    status, now = job.status, db_now(session)
    if not compare_and_set(
        session,
        job,
        IN_STATUS,
        bound={"w_status": status},
        status=JobStatus.succeeded,
        stage=Stage.done,
        done=job.chunk_count or 0,
        total=job.chunk_count or 0,
        finished_at=job.finished_at or now,
        next_attempt_at=None,
        cancel_requested=False,
        error_kind=None,
        error_code=None,
        error_message=None,
        fix_hint=None,
        error_detail=None,
        waiting_for=None,
        waiting_since=None,
        now=now,
    ):
        return False
    add_event(
        session,
        job,
        "rebuild_dropped",
        actor=actor,
        from_status=status,
        to_status=JobStatus.succeeded,
        message=f"{because}: pipeline {to_version} is built instead of rebuilding "
        f"{job.pipeline_version}; search keeps serving this job's chunks",
        data={"to_version": to_version},
    )
    return True


def move_waiting(
    *, session: Session, dataset_id: int, to_version: str, actor: str, reason: str
) -> list[ActionResult]:
    """``reindex --all``: the dataset's jobs of another version than ``to_version`` that wait to
    be claimed (pending, or retrying: a backoff, or a wait such as one for a worker of their
    version, which after a change of the workers' settings never comes and ends only at
    SLUICE_MAX_OUTAGE_SECONDS) move to ``to_version`` now. A document's active job waiting to be
    rebuilt gets its rebuild dropped (it is succeeded again; the reindex then queues the
    document's job of ``to_version`` like any other); any other such job builds ``to_version``
    instead, due at once, unless the document has a job of that version already (which supersedes
    it when it succeeds). Each by compare-and-set, committed; a job that changed meanwhile is left
    as it is. Returns a result for each job moved (a dropped rebuild has its document's new job)."""
    found = session.exec(
        select(Job)
        .where(
            Job.dataset_id == dataset_id,
            Job.pipeline_version != to_version,
            col(Job.status).in_((JobStatus.pending, JobStatus.retrying)),
        )
        .order_by(col(Job.id))
    ).all()
    done: list[ActionResult] = []
    for job in found:
        document = stored(session, Document, job.document_id)
        if document.deleted_at is not None:
            continue
        active = document.active_job_id == job.id
        if active:
            ok = _drop_rebuild(session, job, to_version, actor, because=reason)
        else:
            ok = _move_waiting_one(session, job, document, to_version=to_version, actor=actor)
        if not ok:
            session.rollback()
            continue
        session.commit()
        if not active:
            done.append(
                ActionResult(job.id, True, f"job {job.id} builds pipeline {to_version} now")
            )
    return done


def _move_waiting_one(
    session: Session, job: Job, document: Document, *, to_version: str, actor: str
) -> bool:
    key = idempotency_key(
        dataset_id=job.dataset_id, sha256=document.sha256, pipeline_version=to_version
    )
    if session.exec(select(Job.id).where(Job.idempotency_key == key)).first() is not None:
        return False
    status, from_version, now = job.status, job.pipeline_version, db_now(session)
    try:
        ok = compare_and_set(
            session,
            job,
            IN_STATUS_OF_VERSION,
            bound={"w_status": status, "w_version": from_version},
            pipeline_version=to_version,
            idempotency_key=key,
            next_attempt_at=None if status == JobStatus.pending else now,
            waiting_for=None,
            waiting_since=None,
            now=now,
        )
        if not ok:
            return False
        add_event(
            session,
            job,
            "restamped",
            actor=actor,
            message=f"reindex --all: this job builds pipeline {to_version} instead of "
            f"{from_version}, now",
            data={"from_version": from_version, "to_version": to_version},
        )
        publish(session, job, now)
        session.flush()
    except IntegrityError:  # a job of the new version was just made for this document
        return False
    return True


def stamped_before(*, session: Session, job: Job, moment: datetime | None) -> bool:
    """Did the job get its pipeline version before ``moment`` (its dataset's last settings
    change)? Then the version came from settings no longer in force, which no worker makes. Only
    a move to the version it has counts: a rebuild of the active job that followed a change by
    dropping itself (``follow_version``'s ``succeeded``) kept its old version."""
    if moment is None:
        return False
    moves = session.execute(
        select(JobEvent.at, JobEvent.data).where(
            JobEvent.job_id == job.id, col(JobEvent.kind).in_(("restamped", "version_followed"))
        )
    ).all()
    last = max(
        (at for at, data in moves if (data or {}).get("to_version") == job.pipeline_version),
        default=None,
    )
    stamped = max(_naive(job.created_at), _naive(last)) if last is not None else job.created_at
    return _naive(stamped) < _naive(moment)


def _naive(value: datetime) -> datetime:
    return value.replace(tzinfo=None) if value.tzinfo is not None else value


def follow_version(
    *, session: Session, job_id: int, lease: int, to_version: str, actor: str, reason: str
) -> str:
    """A running attempt of a job whose pipeline version no worker makes any more (its dataset's
    settings changed since it got it, or it waited too long for a worker of it): fenced on the
    lease, it builds ``to_version`` instead. Returns what became of it:

    - ``moved``: it builds ``to_version`` now, in this attempt;
    - ``succeeded``: it is its document's active job (a rebuild of what search serves): the rebuild
      is dropped, the job serves its chunks again, and a job of ``to_version`` is queued;
    - ``superseded``: the document already has a job of ``to_version``, which builds it;
    - ``lost``: the attempt is no longer this lease's.
    """
    job = get_job(session=session, job_id=job_id)
    if job is None or job.lease != lease or job.status != JobStatus.running:
        session.rollback()
        return "lost"
    document = stored(session, Document, job.document_id, populate_existing=True)
    key = idempotency_key(
        dataset_id=job.dataset_id, sha256=document.sha256, pipeline_version=to_version
    )
    other = session.exec(select(Job.id).where(Job.idempotency_key == key)).first()
    data = {"from_version": job.pipeline_version, "to_version": to_version}
    change: dict[str, Any]
    if document.active_job_id == job.id:
        outcome, change = (
            "succeeded",
            dict(
                status=JobStatus.succeeded,
                stage=Stage.done,
                done=job.chunk_count or 0,
                total=job.chunk_count or 0,
                finished_at=job.finished_at or db_now(session),
                worker_id=None,
            ),
        )
    elif other is not None:
        outcome, change = (
            "superseded",
            dict(status=JobStatus.superseded, finished_at=db_now(session), worker_id=None),
        )
    else:
        outcome, change = "moved", dict(pipeline_version=to_version, idempotency_key=key)
    try:
        if not compare_and_set(session, job, RUNNING_ON_LEASE, bound={"w_lease": lease}, **change):
            session.rollback()
            return "lost"
        add_event(
            session,
            job,
            "version_followed",
            actor=actor,
            from_status=JobStatus.running if outcome != "moved" else None,
            to_status=change.get("status"),
            message=f"{reason}: "
            + {
                "moved": f"this job builds pipeline {to_version} instead",
                "succeeded": f"its rebuild is dropped; a job of pipeline {to_version} is queued",
                "superseded": f"job {other} builds pipeline {to_version} of this document",
            }[outcome],
            data=data,
        )
        if outcome == "succeeded":
            create_job(
                session=session,
                document=document,
                pipeline_version=to_version,
                idempotency_key=key,
                max_attempts=job.max_attempts,
                actor=actor,
            )
        session.commit()
    except IntegrityError:  # a job of that version was made for the document at this moment
        session.rollback()
        return "lost"
    return outcome
