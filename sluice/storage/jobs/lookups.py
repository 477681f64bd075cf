"""Reads of the job store: a job, a job with its document and dataset, who owns a running job."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import bindparam, exists
from sqlalchemy import inspect as sa_inspect
from sqlalchemy import select as sql_select
from sqlalchemy.orm import attributes
from sqlmodel import Session, SQLModel, select

from sluice.storage.clock import as_utc, current_time
from sluice.storage.jobs.conditional import JOB
from sluice.storage.jobs.statuses import SUPERSEDABLE
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
    others: bool = True  # whether the document has other jobs a success may supersede


def read_job(session: Session, job_id: int) -> Read | None:
    """The job, the database's time, its document and its dataset, in one statement (instead of
    ``get_job``, ``db_now`` and a read of each row).

    A plain SELECT of the three tables' columns, made once: the objects are built from the row
    without the ORM's loading (about half of what the read cost a tiny job's claim and success).
    An object the session already holds is brought up to date and returned, as the ORM's
    ``populate_existing`` did; any other is the caller's alone (not in the session)."""
    if not 0 < job_id <= MAX_ID:
        return None
    row = session.execute(_READ, {"job_id": job_id}).first()
    if row is None:
        return None
    job, document, dataset = (_built(session, shape, row) for shape in _SHAPES)
    assert isinstance(job, Job)
    return Read(job, as_utc(row[-2]), document, dataset, bool(row[-1]))


@dataclass(frozen=True)
class _Shape:
    """Where a model's columns are in ``_READ``'s row, and the attribute each column loads."""

    model: type[SQLModel]
    start: int
    keys: tuple[str, ...]


def _shapes() -> tuple[_Shape, ...]:
    shapes, start = [], 0
    for model in (Job, Document, Dataset):
        mapper = sa_inspect(model)
        keys = tuple(mapper.get_property_by_column(c).key for c in mapper.local_table.columns)
        shapes.append(_Shape(model, start, keys))
        start += len(keys)
    return tuple(shapes)


def _built(session: Session, shape: _Shape, row: Any) -> Any:
    """The object of ``shape``'s part of ``row`` (None: the outer join found no row)."""
    found = dict(zip(shape.keys, row[shape.start : shape.start + len(shape.keys)], strict=True))
    if found["id"] is None:
        return None
    mapper = sa_inspect(shape.model)
    held = session.identity_map.get(mapper.identity_key_from_primary_key([found["id"]]))
    if held is not None:
        for key, value in found.items():
            attributes.set_committed_value(held, key, value)
        return held
    obj = mapper.class_manager.new_instance()
    attributes.instance_dict(obj).update(found)
    return obj


_SHAPES = _shapes()
_OTHER_JOB = JOB.alias("other_job")
_OTHERS = exists().where(
    _OTHER_JOB.c.document_id == JOB.c.document_id,
    _OTHER_JOB.c.id != JOB.c.id,
    _OTHER_JOB.c.status.in_(SUPERSEDABLE),
)
"""Whether the document has other jobs that a success supersedes (mostly not: the success then
reads none)."""
_DOCUMENT = SQLModel.metadata.tables["document"]
_DATASET = SQLModel.metadata.tables["dataset"]
_READ = (
    sql_select(*JOB.columns, *_DOCUMENT.columns, *_DATASET.columns, current_time(), _OTHERS)
    .select_from(JOB)
    .outerjoin(_DOCUMENT, _DOCUMENT.c.id == JOB.c.document_id)
    .outerjoin(_DATASET, _DATASET.c.id == JOB.c.dataset_id)
    .where(JOB.c.id == bindparam("job_id"))
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
