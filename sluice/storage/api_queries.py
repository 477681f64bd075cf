"""SQL the HTTP API's reads need beyond sluice.storage.queries: jobs by cursor, the event log by id,
both limited to a set of datasets (an API key's)."""

from __future__ import annotations

from collections.abc import Sequence

from sqlmodel import Session, col, func, select

from sluice.storage import id_lists
from sluice.storage.models import Job, JobEvent, JobStatus


def jobs_before(
    *,
    session: Session,
    dataset_ids: Sequence[int] | None,
    statuses: Sequence[str],
    before_id: int | None,
    limit: int,
    document_ids: Sequence[int] | None = None,
) -> list[Job]:
    """Jobs newest first, below ``before_id`` (the cursor), of these datasets (None: all), of
    these documents (None: any)."""
    stmt = select(Job).order_by(col(Job.id).desc()).limit(limit)
    if document_ids is not None:
        stmt = stmt.where(id_lists.clause(col(Job.document_id), document_ids))
    if dataset_ids is not None:
        stmt = stmt.where(col(Job.dataset_id).in_(list(dataset_ids)))
    if statuses:
        stmt = stmt.where(col(Job.status).in_([JobStatus(s) for s in statuses]))
    if before_id is not None:
        stmt = stmt.where(Job.id < before_id)
    return list(session.exec(stmt).all())


def events_between(
    *,
    session: Session,
    after_id: int,
    upto_id: int,
    kinds: Sequence[str],
    dataset_ids: Sequence[int] | None,
) -> list[tuple[JobEvent, Job]]:
    """Events of these kinds with ``after_id < id <= upto_id``, with their jobs, of these
    datasets."""
    stmt = (
        select(JobEvent, Job)
        .join(Job, col(Job.id) == JobEvent.job_id)
        .where(JobEvent.id > after_id, JobEvent.id <= upto_id, col(JobEvent.kind).in_(list(kinds)))
        .order_by(col(JobEvent.id))
    )
    if dataset_ids is not None:
        stmt = stmt.where(col(Job.dataset_id).in_(list(dataset_ids)))
    return [(e, j) for e, j in session.exec(stmt).all()]


def last_event_id(*, session: Session) -> int:
    return int(session.exec(select(func.coalesce(func.max(JobEvent.id), 0))).one())
