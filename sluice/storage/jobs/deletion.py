"""Any job -> deleted: its document was deleted, or a newer version of its external id came."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlmodel import Session, col, select

from sluice.storage import replacements
from sluice.storage.clock import db_now
from sluice.storage.jobs.conditional import compare_and_set
from sluice.storage.jobs.event_log import add_event
from sluice.storage.jobs.job_values import ActionResult
from sluice.storage.models import Document, Job, JobStatus


def mark_deleted(
    *,
    session: Session,
    document_id: int,
    actor: str,
    reason: str = "document deleted",
    attempts: int = 5,
) -> list[ActionResult]:
    """Every job of a document -> deleted, and the document -> deleted_at, in one transaction.

    Jobs and their events stay (the audit trail); search stops answering the document at once. A
    running job loses its fence: its worker's next write fails and it stops. The caller removes the
    vectors and the blob afterwards. A compare-and-set that loses to a worker's write is tried
    again.
    """
    for _ in range(attempts):
        document = session.get(Document, document_id, populate_existing=True)
        if document is None:
            return [ActionResult(0, False, f"document {document_id} does not exist")]
        now = db_now(session)
        results = delete_jobs_of(session, document, actor=actor, reason=reason, now=now)
        if results is None:
            session.rollback()
            continue
        document.deleted_at = document.deleted_at or now
        document.active_job_id = None
        session.add(document)
        session.commit()
        return results
    return [ActionResult(0, False, f"document {document_id}: its jobs kept changing; try again")]


def delete_jobs_of(
    session: Session,
    document: Document,
    *,
    actor: str,
    reason: str,
    now: datetime,
    data: dict[str, Any] | None = None,
) -> list[ActionResult] | None:
    """Every job of ``document`` -> deleted, by compare-and-set, in the caller's transaction; None
    when one compare-and-set lost to a worker's write (the caller rolls back and reads again)."""
    rows = session.exec(
        select(Job)
        .where(Job.document_id == document.id)
        .order_by(col(Job.id))
        .execution_options(populate_existing=True)
    ).all()
    results = []
    for job in rows:
        if job.status == JobStatus.deleted:
            results.append(ActionResult(job.id, True, f"job {job.id} was already deleted"))
            continue
        before = job.status
        if not compare_and_set(
            session,
            job,
            status=JobStatus.deleted,
            cancel_requested=False,
            worker_id=None,
            next_attempt_at=None,
            waiting_for=None,
            waiting_since=None,
            finished_at=job.finished_at or now,
            now=now,
        ):
            return None
        add_event(
            session,
            job,
            "deleted",
            actor=actor,
            from_status=before,
            to_status=JobStatus.deleted,
            message=reason,
            data={
                "document_id": document.id,
                "was_active": document.active_job_id == job.id,
                **(data or {}),
            },
        )
        results.append(ActionResult(job.id, True, f"job {job.id} deleted (was {before.value})"))
    return results


def retire_versions(
    session: Session,
    olds: Sequence[Document],
    *,
    by: Document,
    actor: str,
    now: datetime | None = None,
) -> list[int] | None:
    """Other versions of ``by``'s external id -> deleted, replaced by it, with all their jobs, in
    the caller's transaction: the ids of the jobs whose chunks are to go, or None when a
    compare-and-set was lost (the caller rolls back and reads again)."""
    job_ids: list[int] = []
    for old in olds:
        now = now or db_now(session)
        results = delete_jobs_of(
            session,
            old,
            actor=actor,
            reason=f"replaced by version {by.doc_version} (document {by.id})",
            now=now,
            data={"replaced_by": by.id},
        )
        if results is None or not replacements.retire(session, old, by=by, now=now):
            return None
        job_ids += [r.job_id for r in results]
    return job_ids
