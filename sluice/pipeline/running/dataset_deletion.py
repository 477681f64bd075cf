"""The steps of a dataset's delete after its mark (``Dataset.deleting_at``), each safe to repeat, so
that whoever comes next finishes a delete that died halfway: a rerun of the delete
(sluice.ops.dataset_admin, which marks it), ``sluice recover``, and every worker's periodic
recovery round (sluice.pipeline.queueing.recovery), which finishes the deletes marked more than
``STALE_SECONDS`` ago.

1. cancel the dataset's waiting and running jobs by the cancel path (a running job's worker stops
   at its next batch); wait a bounded time for them, else stop here, to be run again;
2. delete its documents (every job of each -> deleted, the document -> deleted_at), then the
   blobs no live document in any dataset names any more;
3. drop its Chroma collection and its lexical rows;
4. remove its rows (jobs and their events, documents, pauses, switched-off chunks, ...) and the
   dataset's row, in one transaction, and take its id out of every API key's datasets.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import delete as sql_delete
from sqlalchemy import text
from sqlmodel import Session, SQLModel, col, select

from sluice import faults
from sluice.pipeline.running.cleanup import remove_blob_if_unused, remove_partial
from sluice.pipeline.running.context import Context
from sluice.storage import jobs, lexical
from sluice.storage.chunk_edits import ChunkEdit
from sluice.storage.clock import db_now
from sluice.storage.models import ApiKey, Dataset, DisabledChunk, Document, Job, JobStatus

log = logging.getLogger(__name__)

WAITING = (JobStatus.pending, JobStatus.retrying)
POLL = 0.1
# A delete marked longer ago than this is taken to have died (its own wait for running jobs is 30 s
# by default): the periodic recovery finishes it. Finishing one that still runs is harmless, every
# step is safe to repeat and to run beside another.
STALE_SECONDS = 120.0


@dataclass
class Finished:
    ok: bool
    message: str
    code: str = ""  # jobs_still_running


def finish(ctx: Context, dataset_id: int, *, actor: str, wait: float = 30.0) -> Finished:
    """Steps 1 to 4 of the delete of a dataset marked ``deleting_at``; safe to repeat."""
    with Session(ctx.engine, expire_on_commit=False) as session:
        ds = session.get(Dataset, dataset_id)
        if ds is None:
            return Finished(True, f"dataset {dataset_id} is already deleted")
        name, collection = ds.name, ds.collection
    still = _stop_jobs(ctx, dataset_id, actor=actor, wait=wait)
    if still:
        return Finished(
            False,
            f"dataset {name!r} is being deleted; job(s) {', '.join(map(str, still))} have not "
            "stopped yet: run the delete again in a moment (recovery also finishes it)",
            "jobs_still_running",
        )
    removed = _delete_documents(ctx, dataset_id, actor=actor)
    faults.hit("dataset_delete_documents_removed", dataset_id=dataset_id)
    _drop_collection(ctx, collection)
    with Session(ctx.engine) as session:
        job_ids = list(session.exec(select(col(Job.id)).where(Job.dataset_id == dataset_id)).all())
    lexical.delete_jobs(ctx.engine, job_ids)
    _remove_rows(ctx, dataset_id)
    log.info("dataset %r deleted by %s (%d document(s))", name, actor, removed)
    return Finished(True, f"dataset {name!r} deleted: {removed} document(s) removed")


def marked(ctx: Context, *, older_than_seconds: float = 0.0) -> list[int]:
    """The datasets whose delete began (more than ``older_than_seconds`` ago) and did not end."""
    with Session(ctx.engine) as session:
        query = select(col(Dataset.id)).where(col(Dataset.deleting_at).is_not(None))
        if older_than_seconds > 0:
            cutoff = db_now(session) - timedelta(seconds=older_than_seconds)
            query = query.where(col(Dataset.deleting_at) < cutoff)
        return list(session.exec(query.order_by(col(Dataset.id))).all())


def finish_stale(ctx: Context, *, actor: str = "system:recovery") -> list[Finished]:
    """Recovery's part: finish every delete marked more than ``STALE_SECONDS`` ago, without waiting
    for running jobs (the next round tries again)."""
    return [
        finish(ctx, dataset_id, actor=actor, wait=0)
        for dataset_id in marked(ctx, older_than_seconds=STALE_SECONDS)
    ]


def _stop_jobs(ctx: Context, dataset_id: int, *, actor: str, wait: float) -> list[int]:
    """Cancel the dataset's waiting and running jobs; the ids of those still running after
    ``wait`` seconds (their workers stop at their next batch)."""
    with Session(ctx.engine, expire_on_commit=False) as session:
        live = list(
            session.exec(
                select(col(Job.id)).where(
                    Job.dataset_id == dataset_id,
                    col(Job.status).in_([*WAITING, JobStatus.running]),
                )
            ).all()
        )
        if live:
            jobs.request_cancel(session=session, job_ids=live, actor=actor)
            for job in session.exec(select(Job).where(col(Job.id).in_(live))).all():
                if job.status == JobStatus.cancelled:
                    remove_partial(ctx, job)
    deadline = time.monotonic() + wait
    while True:
        with Session(ctx.engine) as session:
            running = list(
                session.exec(
                    select(col(Job.id)).where(
                        Job.dataset_id == dataset_id, Job.status == JobStatus.running
                    )
                ).all()
            )
        if not running or time.monotonic() >= deadline:
            return running
        time.sleep(POLL)


def _delete_documents(ctx: Context, dataset_id: int, *, actor: str) -> int:
    """Every live document of the dataset -> deleted (its vectors and lexical rows go with the
    collection and the lexical rows of step 3), then the blobs of all its documents that nothing
    live names (a rerun after a death between the two removes those too)."""
    with Session(ctx.engine) as session:
        ids = list(
            session.exec(
                select(col(Document.id)).where(
                    Document.dataset_id == dataset_id, col(Document.deleted_at).is_(None)
                )
            ).all()
        )
    for document_id in ids:
        with Session(ctx.engine) as session:
            results = jobs.mark_deleted(
                session=session, document_id=document_id, actor=actor, reason="dataset deleted"
            )
            refused = [r.message for r in results if not r.ok]
            if refused and session.get(Document, document_id) is not None:  # not gone beside us
                raise RuntimeError(f"document {document_id}: {'; '.join(refused)}")
        faults.hit("dataset_delete_document", dataset_id=dataset_id, document_id=document_id)
    with Session(ctx.engine) as session:
        keys = set(
            session.exec(
                select(col(Document.blob_key)).where(Document.dataset_id == dataset_id)
            ).all()
        )
    for key in sorted(keys):
        remove_blob_if_unused(ctx, key)
    return len(ids)


def _drop_collection(ctx: Context, collection: str) -> None:
    """Drop the collection and check that it is gone: a failure stops the delete here (the
    dataset stays marked, a rerun drops it)."""
    ctx.vectors.drop_collection(collection)  # also forgets this process's handle on it
    try:
        ctx.vectors.client.get_collection(collection)
    except Exception as exc:
        if type(exc).__name__ == "NotFoundError" or "does not exist" in str(exc).lower():
            return
        raise
    raise RuntimeError(f"the Chroma collection {collection} is still there after its drop")


def _owners(tables: list[Any], dataset_id: int) -> dict[str, Any]:
    """Each table that belongs to the dataset, directly or through a parent (documents, jobs,
    sources and their entries and runs), and the ids of its rows of the dataset (None for the
    dataset's own table), parents first: a table added later is covered by its foreign keys."""
    owners: dict[str, Any] = {"dataset": None}
    for table in tables:
        if table.name in owners or "id" not in table.c:
            continue
        for fk in table.foreign_keys:
            parent = fk.column.table.name
            if parent in owners and fk.column.name == "id":
                ids = owners[parent]
                where = fk.parent == dataset_id if ids is None else fk.parent.in_(ids)
                owners[table.name] = select(table.c.id).where(where)
                break
    return owners


def _remove_rows(ctx: Context, dataset_id: int) -> None:
    """Every row of the dataset, children first (found by their foreign keys, so a table added
    later is covered; ``disabled_chunk`` has none and is named), then the dataset's row; its id
    leaves every API key's datasets."""
    tables = SQLModel.metadata.sorted_tables
    with Session(ctx.engine) as session:
        owners = _owners(tables, dataset_id)
        for table in reversed(tables):
            if table.name == "dataset":
                continue
            for fk in table.foreign_keys:
                parent = fk.column.table.name
                if parent not in owners or fk.column.name != "id":
                    continue
                ids = owners[parent]
                where = fk.parent == dataset_id if ids is None else fk.parent.in_(ids)
                session.execute(sql_delete(table).where(where))
        session.execute(
            sql_delete(DisabledChunk).where(col(DisabledChunk.dataset_id) == dataset_id)
        )
        session.execute(sql_delete(ChunkEdit).where(col(ChunkEdit.dataset_id) == dataset_id))
        for key in session.exec(select(ApiKey)).all():
            if dataset_id in (key.dataset_ids or []):
                key.dataset_ids = [d for d in key.dataset_ids if d != dataset_id]  # a new list
                session.add(key)
        session.execute(text("DELETE FROM lexical_chunk WHERE dataset_id = :d"), {"d": dataset_id})
        session.execute(sql_delete(Dataset).where(col(Dataset.id) == dataset_id))
        session.commit()
