"""What the job database promises one dataset's index: its jobs, found by the prefix of the chunk
ids they make, and how a chunk id is judged against them (present, in flight, kept or an orphan).

A document a source's sync tombstoned is out of search but keeps its chunks for
``SLUICE_SYNC_TOMBSTONE_HOURS`` (``sluice sources undo`` serves them again, embedding nothing): the
chunks of its active job are **kept**, neither served nor orphans.

Shared by the audit of the vectors (``audit``) and of the lexical index (``lexical_audit``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from sqlmodel import Session, select

from sluice.pipeline.running import chunk_copies
from sluice.storage.models import Document, Job, JobStatus
from sluice.storage.source_records import tombstoned_documents
from sluice.storage.vectors import chunk_prefix, split_chunk_id

BATCH = 1000  # ids per confirm / delete / update request
SAMPLE = 10  # ids kept per document and kind in the report
IN_FLIGHT = frozenset(JobStatus.active())
SERVING = frozenset(
    {JobStatus.succeeded, JobStatus.failed, JobStatus.cancelled}
)  # as an active job
CHECKED_FIELDS = ("job_id", "document_id", "pipeline_version", "position")


# --- what the job database promises ---------------------------------------------------------------


@dataclass(slots=True)
class PromisedJob:
    id: int
    status: JobStatus
    document_id: int
    version: str
    chunk_count: int | None
    live: bool  # its document is not deleted
    active: bool  # the job whose chunks search serves for its document
    row_version: int = 0  # the job row's compare-and-set version when read
    seen: bytearray | None = None  # positions found in the store, for expected jobs
    # the copies of its document its chunks carry: file name and metadata (chunk_copies.copies)
    fields: dict | None = None
    kept: bool = False  # the active job of a tombstoned document: its chunks wait for an undo

    @property
    def expected(self) -> bool:
        return self.active and self.status in SERVING and self.chunk_count is not None


class Snapshot:
    """One dataset's jobs, found by the prefix of the chunk ids they make."""

    def __init__(self, session: Session, dataset_id: int) -> None:
        self.by_prefix: dict[str, PromisedJob] = {}
        self.documents: dict[int, tuple[str, int | None]] = {}  # id -> (filename, active job)
        tombstoned = tombstoned_documents(session, dataset_id)
        stmt = (
            select(  # type: ignore[call-overload]  # sqlmodel types select() up to 4 columns
                Job.id,
                Job.status,
                Job.document_id,
                Job.pipeline_version,
                Job.chunk_count,
                Job.version,
                Document.sha256,
                Document.filename,
                Document.active_job_id,
                Document.deleted_at,
                Document.metadata_,
            )
            .join(Document, Document.id == Job.document_id)
            .where(Job.dataset_id == dataset_id)
        )
        for (
            jid,
            status,
            doc_id,
            version,
            count,
            row_version,
            sha,
            filename,
            active_id,
            deleted_at,
            doc_metadata,
        ) in session.exec(stmt):
            live = deleted_at is None
            self.documents[doc_id] = (filename, active_id if live else None)
            self.by_prefix[chunk_prefix(sha, version)] = PromisedJob(
                jid,
                JobStatus(status),
                doc_id,
                version,
                count,
                live,
                live and active_id == jid,
                row_version,
                fields=chunk_copies.copies(filename, doc_metadata),
                kept=not live and doc_id in tombstoned and active_id == jid,
            )

    def expected_jobs(self) -> Iterator[PromisedJob]:
        return (j for j in self.by_prefix.values() if j.expected)


def chunk_standing(snap: Snapshot, cid: str) -> tuple[str, PromisedJob | None, int, str]:
    """(kind, job, position, why) with kind present | in_flight | kept | orphan."""
    parts = split_chunk_id(cid)
    job = snap.by_prefix.get(parts[0]) if parts else None
    if parts is None or job is None:
        return "orphan", None, -1, "foreign: no job of this dataset makes this id"
    pos = parts[1]
    if job.status in IN_FLIGHT:
        return "in_flight", job, pos, ""
    if job.kept and job.status in SERVING and pos < (job.chunk_count or 0):
        return "kept", job, pos, ""  # a tombstoned document's, for an undo
    if not job.live:
        return "orphan", job, pos, f"of deleted document {job.document_id}"
    if not job.active:
        return "orphan", job, pos, f"left by {job.status.value} job {job.id}"
    if job.chunk_count is None:  # an active job without a count never happens; judge nothing
        return "in_flight", job, pos, ""
    if pos >= job.chunk_count:
        return "orphan", job, pos, f"beyond the {job.chunk_count} chunks of job {job.id}"
    return "present", job, pos, ""


def position(cid: str) -> int:
    """The position in its job of a chunk id a Sluice job made (the caller knows it is one)."""
    parts = split_chunk_id(cid)
    if parts is None:
        raise ValueError(f"{cid!r} is not a chunk id of a Sluice job")
    return parts[1]


def unchanged(first: Snapshot, then: Snapshot, cid: str) -> bool:
    """The job that makes ``cid`` (or the absence of one) is the same in both snapshots."""
    parts = split_chunk_id(cid)
    if parts is None:
        return True
    a, b = first.by_prefix.get(parts[0]), then.by_prefix.get(parts[0])
    if a is None or b is None:
        return a is b
    return (a.id, a.row_version, a.active, a.live, a.kept) == (
        b.id,
        b.row_version,
        b.active,
        b.live,
        b.kept,
    )


def wrong_fields(job: PromisedJob, pos: int, meta: dict | None) -> dict[str, list]:
    meta = meta or {}
    want = {
        "job_id": job.id,
        "document_id": job.document_id,
        "pipeline_version": job.version,
        "position": pos,
    }
    wrong = {k: [meta.get(k), v] for k, v in want.items() if meta.get(k) != v}
    # the copies of the document: its file name and metadata (None wanted: a key that must go)
    fields, carried = job.fields or {}, chunk_copies.carried(meta)
    for k in sorted(set(fields) | set(carried)):
        if carried.get(k) != fields.get(k):
            wrong[k] = [carried.get(k), fields.get(k)]
    return wrong
