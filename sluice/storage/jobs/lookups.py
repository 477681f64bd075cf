"""Reads of the job store: a job, a job with its document and dataset, who owns a running job."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import bindparam
from sqlmodel import Session, col, select

from sluice.storage.clock import as_utc, current_time
from sluice.storage.jobs.conditional import JOB
from sluice.storage.models import MAX_ID, Dataset, Document, Job, JobStatus


def get_job(*, session: Session, job_id: int) -> Job | None:
    if not 0 < job_id <= MAX_ID:  # no row has it (PostgreSQL refuses to compare it with one)
        return None
    return session.get(Job, job_id, populate_existing=True)


def load_many(session: Session, job_ids: Iterable[int]) -> list[tuple[int, Job | None]]:
    return [(jid, get_job(session=session, job_id=jid)) for jid in job_ids]


@dataclass(frozen=True)
class Read:
    """A job as stored now, the database's time, and the rows of its document and dataset."""

    job: Job
    now: datetime
    document: Document | None
    dataset: Dataset | None


def read_job(session: Session, job_id: int) -> Read | None:
    """The job, the database's time, its document and its dataset, in one statement (instead of
    ``get_job``, ``db_now`` and a read of each row)."""
    if not 0 < job_id <= MAX_ID:
        return None
    row = session.execute(_READ, {"job_id": job_id}).first()
    return None if row is None else Read(row[0], as_utc(row[1]), row[2], row[3])


_READ = (
    select(Job, current_time(), Document, Dataset)
    .outerjoin(Document, col(Document.id) == col(Job.document_id))
    .outerjoin(Dataset, col(Dataset.id) == col(Job.dataset_id))
    .where(col(Job.id) == bindparam("job_id"))
    .execution_options(populate_existing=True)
)

_OWNS = select(JOB.c.id).where(
    JOB.c.id == bindparam("job_id"),
    JOB.c.lease == bindparam("lease"),
    JOB.c.status == JobStatus.running,
)


def owns(*, session: Session, job_id: int, lease: int) -> bool:
    """Does the attempt of ``lease`` still own the running job?"""
    found = session.execute(_OWNS, {"job_id": job_id, "lease": lease}).first()
    session.rollback()
    return found is not None


def cancel_requested(*, session: Session, job_id: int) -> bool:
    return bool(
        session.execute(select(Job.cancel_requested).where(Job.id == job_id)).scalar_one_or_none()
    )


def running_on(*, session: Session, worker_id: str) -> list[tuple[int, int]]:
    """(job id, lease) of every job running on this worker."""
    rows = session.exec(
        select(Job.id, Job.lease).where(Job.status == JobStatus.running, Job.worker_id == worker_id)
    ).all()
    session.rollback()
    return [(int(job_id), int(lease)) for job_id, lease in rows]
