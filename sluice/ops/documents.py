"""Delete a document: its vectors, its blob when nothing else needs it, and its jobs marked deleted.

The job rows and their events stay, so the audit trail shows who deleted what and when. Blobs are
content-addressed and shared by every dataset: a blob is removed only when no other document, in
any dataset, needs the same bytes (a live one, or a source's tombstone that undo may bring back);
what a delete reports counts its own dataset's documents only.

A reference names the document directly (``doc:42``) or by any of its jobs (``17``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from sqlalchemy import or_
from sqlmodel import Session, col, func, select

from sluice.errors import OperationError
from sluice.pipeline.running.cleanup import remove_blob_if_unused
from sluice.pipeline.running.context import Context
from sluice.storage import jobs, lexical, replacements
from sluice.storage.db import stored
from sluice.storage.models import Dataset, Document, Job, JobStatus
from sluice.storage.source_records import can_come_back
from sluice.storage.vectors import chunk_id

log = logging.getLogger(__name__)

DOC_PREFIX = "doc:"
ASK = 1000  # chunk ids asked of the store in one request


class UnknownReference(OperationError):
    """The reference names no job or document; the message says which and how to write one."""

    code, status = "not_found", 404
    hint = "Write a job id, or doc:ID for a document id."


@dataclass
class DocumentInfo:
    """What a delete would touch (the preview) or touched."""

    document_id: int
    dataset: str
    filename: str
    sha256: str
    size: int
    deleted: bool
    active_job_id: int | None
    jobs: list[dict] = field(default_factory=list)  # id, status, pipeline_version, chunk_count
    vectors: int = 0  # chunks of this document in its dataset's collection now
    blob_shared_with: int = 0  # other live documents of its dataset with the same bytes
    running: list[int] = field(default_factory=list)


@dataclass
class DeleteResult:
    ok: bool
    message: str
    document: DocumentInfo | None = None
    vectors_removed: int = 0
    blob_removed: bool = False
    jobs_deleted: list[int] = field(default_factory=list)

    def to_dict(self) -> dict:
        """What the CLI prints with --json: the result, with the document as it was before."""
        return {**asdict(self), "document": asdict(self.document) if self.document else None}


def parse_reference(ref: str | int) -> tuple[str, int]:
    """``doc:42`` -> ("document", 42); ``17`` -> ("job", 17)."""
    text = str(ref).strip()
    kind = "job"
    if text.lower().startswith(DOC_PREFIX):
        kind, text = "document", text[len(DOC_PREFIX) :]
    if not text.isdigit():
        raise UnknownReference(
            f"{ref!r} is neither a job id (e.g. 17) nor a document id (e.g. doc:42)"
        )
    return kind, int(text)


def resolve(ctx: Context, ref: str | int) -> int:
    """The document id a reference names."""
    kind, number = parse_reference(ref)
    with Session(ctx.engine) as session:
        if kind == "document":
            if session.get(Document, number) is None:
                raise UnknownReference(f"no document {number}")
            return number
        job = session.get(Job, number)
        if job is None:
            raise UnknownReference(f"no job {number} (write doc:{number} for a document id)")
        return job.document_id


def find_by_external_id(ctx: Context, dataset: str, external_id: str) -> int | None:
    """The id of the live document the application calls ``external_id`` in ``dataset`` (the
    version that serves, or the first one still being built); None when there is none."""
    with Session(ctx.engine) as session:
        ds = session.exec(select(Dataset).where(Dataset.name == dataset)).first()
        if ds is None:
            return None
        doc = replacements.live(session, dataset_id=ds.id, external_id=external_id)
        return doc.id if doc is not None else None


def document_info(ctx: Context, document_id: int) -> DocumentInfo:
    with Session(ctx.engine) as session:
        doc = session.get(Document, document_id)
        if doc is None:
            raise UnknownReference(f"no document {document_id}")
        ds = stored(session, Dataset, doc.dataset_id)
        rows = session.exec(
            select(Job).where(Job.document_id == document_id).order_by(col(Job.id))
        ).all()
        shared = blob_users(session, doc, dataset_only=True)
    info = DocumentInfo(
        document_id=doc.id,
        dataset=ds.name,
        filename=doc.filename,
        sha256=doc.sha256,
        size=doc.size,
        deleted=doc.deleted_at is not None,
        active_job_id=doc.active_job_id,
        jobs=[
            {
                "id": j.id,
                "status": j.status.value,
                "pipeline_version": j.pipeline_version,
                "chunk_count": j.chunk_count,
            }
            for j in rows
        ],
        blob_shared_with=shared,
        running=[j.id for j in rows if j.status == JobStatus.running],
    )
    info.vectors = _vector_count(ctx, ds.collection, doc, rows)
    return info


def _vector_count(ctx: Context, collection: str, doc: Document, rows: Sequence[Job]) -> int:
    """How many of the document's chunks the index holds, asked by id: a job's ids follow from the
    bytes, its pipeline version and its chunk count. A metadata filter, which Chroma answers by
    walking the collection (33 ms a filter at 300,000 chunks), is left to a job still chunking,
    whose count is not known yet; a chunk under an id none of its jobs makes is reconcile's."""
    if any(j.chunk_count is None and j.status in JobStatus.active() for j in rows):
        return len(_vector_ids(ctx, collection, doc.id, [j.id for j in rows]))
    ids = sorted(
        {
            chunk_id(doc.sha256, j.pipeline_version, position)
            for j in rows
            for position in range(j.chunk_count or 0)
        }
    )
    return sum(
        len(ctx.vectors.get(collection, ids[start : start + ASK], include=[])["ids"])
        for start in range(0, len(ids), ASK)
    )


def delete_document(
    ctx: Context, ref: str | int, *, actor: str, reason: str = "document deleted"
) -> DeleteResult:
    """Delete the document a reference names. Safe to repeat: a second call removes what is left."""
    try:
        document_id = resolve(ctx, ref)
        before = document_info(ctx, document_id)
    except UnknownReference as exc:
        return DeleteResult(False, str(exc))
    with Session(ctx.engine) as session:
        results = jobs.mark_deleted(
            session=session, document_id=document_id, actor=actor, reason=reason
        )
        refused = [r for r in results if not r.ok]
        if refused:
            return DeleteResult(False, "; ".join(r.message for r in refused), before)
        doc = stored(session, Document, document_id)
        collection = stored(session, Dataset, doc.dataset_id).collection
        blob_key, users = doc.blob_key, blob_users(session, doc)
        shared = blob_users(session, doc, dataset_only=True)
    job_ids = [j["id"] for j in before.jobs]
    ids = _vector_ids(ctx, collection, document_id, job_ids)
    ctx.vectors.delete(collection, ids=ids)
    lexical.delete_jobs(ctx.engine, job_ids)
    # The bytes stay while any document uses them, but what the delete reports is of this dataset
    # alone: whether another dataset holds the same file is not its key's to learn.
    removed = remove_blob_if_unused(ctx, blob_key) if users == 0 else False
    blob_removed = shared == 0 and (removed or users > 0)
    newly = [j["id"] for j in before.jobs if j["status"] != JobStatus.deleted.value]
    noted = newly or (job_ids[-1:] if ids or blob_removed else [])
    with Session(ctx.engine) as session:
        for jid in noted:
            jobs.add_event(
                session,
                stored(session, Job, jid),
                "vectors_removed",
                actor=actor,
                message=f"document deleted: {len(ids)} chunk(s) removed from the index; blob "
                + (
                    "removed"
                    if blob_removed
                    else f"kept ({shared} other document(s) share it)"
                    if shared
                    else "already gone"
                ),
                data={"chunks": len(ids), "blob_removed": blob_removed, "blob_shared_with": shared},
            )
        session.commit()
    message = (
        f"deleted document {document_id} ({before.filename}, dataset {before.dataset}): "
        f"{len(ids)} chunk(s) removed, {len(newly)} job(s) marked deleted, "
        f"blob {'removed' if blob_removed else 'kept' if shared else 'already gone'}"
        + (f" ({shared} other document(s) use the same bytes)" if shared else "")
    )
    if before.running:
        message += (
            f"; job(s) {', '.join(map(str, before.running))} were running and stop at their next "
            "batch (`sluice reconcile --repair` removes anything written after this)"
        )
    log.info("%s by %s", message, actor)
    return DeleteResult(
        True,
        message,
        before,
        vectors_removed=len(ids),
        blob_removed=blob_removed,
        jobs_deleted=newly,
    )


def blob_users(session: Session, doc: Document, *, dataset_only: bool = False) -> int:
    """Other documents that need the same blob: live ones, and hidden ones that can come back (a
    source's tombstone names them: ``sources undo`` serves them again); in any dataset (whether
    the bytes may go), or in the document's own (what may be said of them)."""
    where: list[Any] = [
        Document.blob_key == doc.blob_key,
        Document.id != doc.id,
        or_(col(Document.deleted_at).is_(None), can_come_back(Document.id)),
    ]
    if dataset_only:
        where.append(Document.dataset_id == doc.dataset_id)
    return session.exec(select(func.count()).select_from(Document).where(*where)).one()


def _vector_ids(ctx: Context, collection: str, document_id: int, job_ids: list[int]) -> list[str]:
    """Ids of the document's chunks, found by document and by job (a chunk whose metadata names
    another document is not this document's to delete; reconcile reports it)."""
    found = set(ctx.vectors.ids_where(collection, {"document_id": document_id}))
    if job_ids:
        found.update(ctx.vectors.ids_where(collection, {"job_id": {"$in": job_ids}}))
    return sorted(found)
