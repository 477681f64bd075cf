"""The fence of an ended attempt's cleanup: what it wrote may go only while no later attempt owns
the job (``sluice.pipeline.running.cleanup.remove_partial``)."""

from __future__ import annotations

from sqlalchemy import bindparam, select
from sqlalchemy.engine import Connection
from sqlmodel import SQLModel

from sluice.storage.jobs.conditional import JOB

_DOCUMENT = SQLModel.metadata.tables["document"]
_DATASET = SQLModel.metadata.tables["dataset"]

_HOLD = (
    select(_DATASET.c.collection, _DOCUMENT.c.active_job_id)
    .select_from(
        JOB.join(_DOCUMENT, _DOCUMENT.c.id == JOB.c.document_id).join(
            _DATASET, _DATASET.c.id == JOB.c.dataset_id
        )
    )
    .where(JOB.c.id == bindparam("job_id"), JOB.c.lease == bindparam("lease"))
    .with_for_update(of=JOB)  # PostgreSQL: a claim (which bumps the lease) waits for the cleanup
)


def hold_for_cleanup(conn: Connection, job_id: int, lease: int) -> str | None:
    """In the cleanup's transaction: the collection to remove the job's chunks from while the
    attempt of ``lease`` is still the job's last, with the job's row held until the transaction
    ends (on SQLite the caller holds the write lock already), so no claim lands meanwhile. None
    when a later attempt claimed the job (its chunks are its own now), when the job's chunks are
    the ones search serves (a reindex of the active job rewrote the same ids), or when the job is
    gone."""
    row = conn.execute(_HOLD, {"job_id": job_id, "lease": lease}).first()
    if row is None or row.active_job_id == job_id:
        return None
    return str(row.collection)
