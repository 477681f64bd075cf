"""The copies of its document a chunk carries in the vector store: its file name (``filename``, what
a dense hit shows) and its metadata (``meta_<key>``, for Chroma's own filters). They are rewritten
in place, never with their vectors: when the document's metadata changes (``sluice.ops.metadata``),
when a source's sync renames it (``follow_document``), and by a job that finds them changed while
it wrote its chunks. Reconcile compares them with the document row and repairs them
(``sluice.pipeline.reconcile``).

The document's sha256 is carried too, but never changes (the chunk ids are made of it); its
external id is not carried: search and filters read it from the row."""

from __future__ import annotations

import logging
from typing import Any

from sluice import faults
from sluice.pipeline.running.context import Context

log = logging.getLogger(__name__)

REWRITE_BATCH = 500  # chunks whose copy one request to the vector store rewrites
FILENAME = "filename"  # the chunk's copy of its document's display name
FOLLOW_ROUNDS = 5  # reads of the row a follow makes at most, when it keeps changing under it


def copies(filename: str | None, metadata: dict[str, Any] | None) -> dict[str, Any]:
    """What each chunk of a document named ``filename`` with ``metadata`` carries of it (None as
    the file name: only the metadata copy, the name left as it is)."""
    from sluice.storage import vectors

    fields = vectors.metadata_fields(metadata or {})
    return fields if filename is None else {FILENAME: filename, **fields}


def carried(chunk_metadata: dict[str, Any] | None) -> dict[str, Any]:
    """The copies one chunk's stored metadata holds (what ``copies`` wrote); a missing file name
    is None, so that it differs from every document's."""
    from sluice.storage import vectors

    meta = chunk_metadata or {}
    return {FILENAME: meta.get(FILENAME), **vectors.stored_metadata_fields(meta)}


def rewrite(
    ctx: Context,
    collection: str,
    where: dict[str, Any],
    metadata: dict[str, Any] | None,
    *,
    filename: str | None = None,
) -> int:
    """Make every chunk ``where`` selects (``{"document_id": d}``, ``{"job_id": j}``) carry
    ``metadata`` (and ``filename``, when given); the number rewritten."""
    ids = ctx.vectors.ids_where(collection, where)
    # The store's rewrite makes the meta_ fields exactly these and merges the others (the name).
    fields = copies(filename, metadata)
    done = 0
    for start in range(0, len(ids), REWRITE_BATCH):
        if start:
            faults.hit("metadata_rewrite_batch", done=done, **where)
        done += ctx.vectors.set_metadata_fields(
            collection, ids[start : start + REWRITE_BATCH], fields
        )
    return done


def _row(ctx: Context, document_id: int) -> tuple[str, str, dict[str, Any] | None] | None:
    """(collection, filename, metadata) of the document as its row says now; None when gone."""
    from sqlmodel import Session

    from sluice.storage.models import Dataset, Document

    with Session(ctx.engine) as session:
        doc = session.get(Document, document_id)
        ds = session.get(Dataset, doc.dataset_id) if doc is not None else None
        if doc is None or ds is None:
            return None
        return ds.collection, doc.filename, doc.metadata_


def follow_document(ctx: Context, document_id: int | None) -> int:
    """Make every chunk of the document (all its jobs) carry what its row says now: its file name
    and metadata, after a rename; nothing is embedded again. The row is read again after the
    rewrite and the rewrite repeated while it changed meanwhile, so a change landing during it is
    not undone by it. Returns the chunks rewritten (0 for no document). A vector store that does
    not answer leaves the copies to reconcile: logged, not raised (the rename is committed)."""
    if document_id is None:
        return 0
    done, written = 0, None
    try:
        for _ in range(FOLLOW_ROUNDS):
            row = _row(ctx, document_id)
            if row is None or row == written:
                break
            collection, filename, metadata = row
            done = rewrite(
                ctx, collection, {"document_id": document_id}, metadata, filename=filename
            )
            written = row
    except Exception as exc:  # search filters on the row; reconcile repairs the copies
        log.warning("document %s: its chunks' copies could not follow it: %s", document_id, exc)
    return done
