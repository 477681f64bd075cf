"""Removing what an attempt wrote to the index when it ends without success (cancelled,
superseded), by whoever ends it: its own worker, the heartbeat's watchdog, or the reaper; and the
blobs no live document names any more (a deleted or replaced document's)."""

from __future__ import annotations

import logging

from sqlalchemy import or_, text
from sqlmodel import Session, col, func, select

from sluice import faults
from sluice.errors import WaitingError
from sluice.pipeline.running.context import Context
from sluice.storage import jobs
from sluice.storage.models import Document, Job
from sluice.storage.source_records import can_come_back

log = logging.getLogger(__name__)


def remove_partial(ctx: Context, job: Job) -> bool:
    """Delete what the attempt of ``job.lease`` (and those before it) wrote, vectors and lexical
    rows, unless those chunks are the ones search serves (a reindex of the active job rewrites the
    same ids). True if it removed them.

    Fenced on that attempt: ``job`` is the job as its caller ended it (or as its own running
    attempt holds it). Once another attempt claimed the job (a retry, a revive, an upload of the
    same bytes again: the lease moved on), that attempt owns the chunks, which it took over from
    this one, and nothing is removed. The check and the deletes are one transaction holding the
    job's row (``jobs.hold_for_cleanup``), so a claim waits until they are done instead of landing
    between them and writing chunks that this cleanup then deletes."""
    faults.hit("before_cleanup", job_id=job.id, lease=job.lease)
    try:
        with ctx.engine.begin() as conn:
            # The lexical delete comes first, as in ``lexical.write_job``: on SQLite it takes the
            # write lock, so the fence below reads the latest row and no claim lands before this
            # commits; on PostgreSQL both take the lexical rows, then the job's row, in that order.
            conn.execute(_DELETE_LEXICAL, {"j": job.id})
            collection = jobs.hold_for_cleanup(conn, job.id, job.lease)
            if collection is None:  # another attempt owns the job, or its chunks serve search
                conn.rollback()
                return False
            ctx.vectors.delete(collection, where={"job_id": job.id})
    except Exception as exc:  # reconcile finds and removes such orphans later
        log.warning("job %s: could not remove partial vectors: %s", job.id, exc)
        return False
    return True


_DELETE_LEXICAL = text("DELETE FROM lexical_chunk WHERE job_id = :j")  # as lexical.delete_job


def remove_blob_if_unused(ctx: Context, key: str) -> bool:
    """Remove a blob that no live document names, safe against an upload of the same bytes at the
    same moment (see ``BlobStore.retire``). True if it was removed."""
    if _live_users(ctx, key):
        return False
    faults.hit("blob_unused", key=key)
    try:
        aside = ctx.blobs.retire(key)
        if aside is None:
            return False
        faults.hit("blob_retired", key=key)
        if _live_users(ctx, key):  # an upload committed a document of these bytes meanwhile
            ctx.blobs.unretire(key, aside)
            return False
        ctx.blobs.drop(aside)
    except WaitingError as err:  # the object store does not answer: the blob stays (or aside)
        log.warning("blob %s not removed: %s", key[:12], err.message)
        return False
    return True


def _live_users(ctx: Context, key: str) -> int:
    """Documents that need the blob: live ones, and hidden ones that can come back (a source's
    tombstone names them: an undo serves them again, and a rebuild reads these bytes)."""
    with Session(ctx.engine) as session:
        return session.exec(
            select(func.count())
            .select_from(Document)
            .where(
                Document.blob_key == key,
                or_(col(Document.deleted_at).is_(None), can_come_back(Document.id)),
            )
        ).one()


def remove_replaced_blobs(ctx: Context, document_id: int) -> int:
    """After a new version of an external id went live: the blobs of the versions it replaced,
    unless another live document has the same bytes. The number removed."""
    with Session(ctx.engine) as session:
        keys = session.exec(
            select(col(Document.blob_key)).where(
                Document.replaced_by == document_id, col(Document.deleted_at).is_not(None)
            )
        ).all()
    return sum(remove_blob_if_unused(ctx, key) for key in set(keys))
