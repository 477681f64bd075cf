"""The metadata copy a document's chunks carry in the vector store (``meta_<key>``, for Chroma's own
filters): rewritten in place, never with their vectors, when the document's metadata changes (by
``sluice.ops.metadata``), and by a job that finds the metadata changed while it wrote its chunks."""

from __future__ import annotations

from typing import Any

from sluice import faults
from sluice.pipeline.running.context import Context

REWRITE_BATCH = 500  # chunks whose copy one request to the vector store rewrites


def rewrite(
    ctx: Context, collection: str, where: dict[str, Any], metadata: dict[str, Any] | None
) -> int:
    """Make every chunk ``where`` selects (``{"document_id": d}``, ``{"job_id": j}``) carry
    ``metadata``; the number rewritten."""
    from sluice.storage import vectors

    ids = ctx.vectors.ids_where(collection, where)
    fields = vectors.metadata_fields(metadata or {})
    done = 0
    for start in range(0, len(ids), REWRITE_BATCH):
        if start:
            faults.hit("metadata_rewrite_batch", done=done, **where)
        done += ctx.vectors.set_metadata_fields(
            collection, ids[start : start + REWRITE_BATCH], fields
        )
    return done
