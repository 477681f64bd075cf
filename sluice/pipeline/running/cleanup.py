"""Removing what an attempt wrote to the index when it ends without success (cancelled,
superseded), by whoever ends it: its own worker, the heartbeat's watchdog, or the reaper."""

from __future__ import annotations

import logging

from sqlmodel import Session

from sluice.pipeline.running.context import Context
from sluice.storage import lexical
from sluice.storage.db import stored
from sluice.storage.models import Dataset, Document, Job

log = logging.getLogger(__name__)


def remove_partial(ctx: Context, job: Job) -> None:
    """Delete what this job wrote (vectors and lexical rows), unless those chunks are the ones
    search serves (a reindex of the active job rewrites the same ids)."""
    with Session(ctx.engine, expire_on_commit=False) as session:
        document = stored(session, Document, job.document_id)
        dataset = stored(session, Dataset, job.dataset_id)
    if document.active_job_id == job.id:
        return
    try:
        ctx.vectors.delete(dataset.collection, where={"job_id": job.id})
        lexical.delete_job(ctx.engine, job.id)
    except Exception as exc:  # reconcile finds and removes such orphans later
        log.warning("job %s: could not remove partial vectors: %s", job.id, exc)
