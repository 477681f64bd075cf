"""What an API key may see and do: every read and action of the HTTP API, limited to the key's
datasets and scope, over the same functions the console and the CLI call.

The rule of reach: whatever lies outside a key's datasets does not exist for it, by name or by id.
``Missing`` is raised for it with the very words of a thing that does not exist at all, so neither
the answer nor its timing tells them apart. Reach is checked before scope: a key learns that it
lacks a scope (``ScopeMissing``) only about things it can see.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlmodel import Session

from sluice.errors import OperationError, PipelineError
from sluice.ops import actions, diagnosis, document_view, reads, replacing
from sluice.ops.actions import ActionReport
from sluice.ops.chunks import ChunkState, UnknownChunk
from sluice.ops.documents import UnknownReference, find_by_external_id
from sluice.ops.ingest import IngestResult, sanitize_filename
from sluice.ops.keys import ApiPrincipal, Scope
from sluice.ops.metadata import (
    UnknownDocument,
    filtered_documents,
    matching_job_documents,
    parse_where,
)
from sluice.ops.search import SearchHit
from sluice.pipeline.parsing.parse import sniff_type
from sluice.storage import api_queries, outbox, pauses, queries
from sluice.storage.clock import as_utc, db_now
from sluice.storage.jobs import get_job
from sluice.storage.models import MAX_ID, Document, Job, JobStatus

FINAL = {s.value for s in JobStatus.final()}
START_STEP_SECONDS = 15


class Missing(OperationError):
    """Not there, or not this key's to see: the same answer for both."""

    code, status = "not_found", 404
    hint = "Check the name or id: a key sees only the things of its own datasets."


class ScopeMissing(OperationError):
    """The key may see this but not do that."""

    code, status = "scope_missing", 403
    hint = "Use a key with that scope: sluice keys create NAME --scope ingest (or manage)."


def require(key: ApiPrincipal, scope: Scope, action: str) -> None:
    if not key.allows(scope):
        raise ScopeMissing(f"key {key.name!r} has scope {key.scope}; {action} needs {scope}")


def _dataset(session: Session, key: ApiPrincipal, name: str):
    ds = queries.dataset_by_name(session=session, name=name)
    if ds is None or not key.reaches(ds.id):
        raise Missing(f"no dataset named {name!r}")
    return ds


def _job(session: Session, key: ApiPrincipal, job_id: int) -> Job:
    job = get_job(session=session, job_id=job_id)
    if job is None or not key.reaches(job.dataset_id):
        raise Missing(f"no job {job_id}")
    return job


def _document(session: Session, key: ApiPrincipal, document_id: int) -> Document:
    doc = session.get(Document, document_id)
    if doc is None or not key.reaches(doc.dataset_id):
        raise Missing(f"no document {document_id}")
    return doc


def _session() -> Session:
    return Session(reads.ctx().engine, expire_on_commit=False)


# --- datasets -------------------------------------------------------------------------------------


def _summary(row: dict) -> dict:
    return {k: row[k] for k in ("name", "documents", "chunks", "jobs", "created_at")}


def datasets(key: ApiPrincipal) -> list[dict]:
    return [_summary(d) for d in reads.dataset_summaries() if key.reaches(d["id"])]


def dataset(key: ApiPrincipal, name: str) -> dict:
    with _session() as session:
        ds = _dataset(session, key, name)
    found = [d for d in reads.dataset_summaries() if d["id"] == ds.id]
    if not found:
        raise Missing(f"no dataset named {name!r}")
    return _summary(found[0])


def create_dataset(key: ApiPrincipal, name: str) -> tuple[bool, str]:
    """Only a manage key of every dataset makes datasets (a key of some cannot widen its reach)."""
    if not (key.all_datasets and key.allows("manage")):
        raise ScopeMissing(
            f"key {key.name!r}: creating datasets needs a manage key of every dataset"
        )
    return actions.create_dataset(key.operator, name)


# --- uploads --------------------------------------------------------------------------------------


def upload(
    key: ApiPrincipal, *, dataset: str, dataset_id: int | None = None, **upload: Any
) -> IngestResult:
    """``actions.upload`` (its ``filename``, ``stream``, ``external_id``, ``metadata``,
    ``declared_type``) by the
    key's operator, once ``check_upload`` lets it through; into ``dataset_id`` when the route
    resolved it already (renamed since: still that one), never into a dataset made anew."""
    if dataset_id is None:
        dataset_id = check_upload(key, dataset)
    elif not key.reaches(dataset_id):
        raise Missing(f"no dataset named {dataset!r}")
    else:
        require(key, "ingest", "uploading")
    return actions.upload(key.operator, dataset=dataset, dataset_id=dataset_id, **upload)


def type_refusal(head: bytes, filename: str, declared: str = "") -> IngestResult | None:
    """Why ``ingest`` would refuse a file by its first bytes (unsupported, empty), or None: checked
    for every file of a request before any is stored."""
    try:
        sniff_type(head, sanitize_filename(filename), declared)
    except PipelineError as err:
        return IngestResult(
            sanitize_filename(filename),
            False,
            error_kind=err.kind.value,
            error_code=err.code,
            message=err.message,
            fix_hint=err.hint,
        )
    return None


def check_upload(key: ApiPrincipal, dataset: str) -> int:
    """Refuse an upload before its body is read: a dataset out of reach, or a key without ingest.
    The dataset's id: the upload names it by that from here on."""
    with _session() as session:
        ds = _dataset(session, key, dataset)
    require(key, "ingest", "uploading")
    return ds.id


# --- jobs -----------------------------------------------------------------------------------------


def waiting(session: Session, job: Job, key: ApiPrincipal | None = None) -> dict[str, Any] | None:
    """Why a job that is not running waits, and when it should start: the console's diagnosis
    (``sluice.ops.diagnosis``), in the API's words. With a key that does not see every dataset the
    place, the running work and the pace are those of the job's dataset alone: other datasets' jobs
    take turns with it, and nothing says how many."""
    found = diagnosis_of(session, job, None if key is None or key.all_datasets else job.dataset_id)
    if found is None or job.status not in (JobStatus.pending, JobStatus.retrying):
        return None
    if found.reason in ("outage", "backoff"):
        starts = job.next_attempt_at
    elif found.starts_in is not None:  # on a 15 s grid, so that a poll of an unchanged queue: 304
        moment = as_utc(db_now(session) + found.starts_in).timestamp()
        starts = datetime.fromtimestamp(
            math.ceil(moment / START_STEP_SECONDS) * START_STEP_SECONDS, UTC
        )
    else:
        starts = None
    out: dict[str, Any] = {
        "reason": found.reason,
        "detail": found.detail,
        "waiting_for": found.waiting_for or None,
        "starts_at": as_utc(starts).isoformat() if starts is not None else None,
        "basis": found.basis or None,
    }
    if found.ahead is not None:
        out["ahead"] = found.ahead
    return out


def diagnosis_of(session: Session, job: Job, dataset_id: int | None) -> diagnosis.Diagnosis | None:
    """The job's diagnosis from what the API reads: its pause, its place in the dispatcher's order
    (of ``dataset_id``'s jobs alone, when given) and the measures."""
    held = pauses.pause_for(session=session, dataset_id=job.dataset_id)
    ctx = reads.ctx()
    ahead = 0
    if job.status == JobStatus.pending and held is None:
        ahead = outbox.queue_place(
            session=session,
            job_id=int(job.id or 0),
            dataset_ids=None if dataset_id is None else [dataset_id],
            window=bool(ctx.settings.dispatch_per_thread),
        )
    facts = diagnosis.Facts(
        row=queries.job_row(job),
        now=db_now(session),
        measured=diagnosis.measured(session, ctx.engine, ctx.instance_id, dataset_id),
        ahead=ahead,
        paused=pauses.describe(held) if held is not None else "",
        lease_seconds=ctx.settings.lease_seconds,
        own_dataset=dataset_id is not None,
    )
    return diagnosis.diagnose(facts)


def job_state(session: Session, job: Job, key: ApiPrincipal | None = None) -> dict[str, Any]:
    row = queries.job_row(job)
    for private in ("worker_id", "dataset_id", "dismissed"):
        row.pop(private, None)
    names = queries.dataset_names(session=session)
    waits = waiting(session, job, key)
    return {
        **row,
        "dataset": names.get(job.dataset_id, ""),
        "final": row["status"] in FINAL,
        "waiting": waits,
        # what it waits for, whatever holds it (a worker, a resume, its turn), not only an outage
        "waiting_for": waits["waiting_for"] if waits else row["waiting_for"],
    }


def job(key: ApiPrincipal, job_id: int) -> dict[str, Any]:
    with _session() as session:
        found = _job(session, key, job_id)
        state = job_state(session, found, key)
    version = replacing.version_state(reads.ctx(), found.document_id)
    return {**state, "version_message": version.message or None}


@dataclass
class JobsPage:
    jobs: list[dict[str, Any]]
    next_cursor: str | None


def jobs(
    key: ApiPrincipal,
    *,
    dataset: str | None,
    statuses: list[str],
    limit: int,
    cursor: str | None,
    where: dict | None = None,
) -> JobsPage:
    """Jobs newest first; ``cursor`` is the ``next_cursor`` of the page before. ``where``: only
    jobs of documents this metadata filter allows."""
    before = min(int(cursor), MAX_ID) if cursor else None
    conditions = parse_where(where)
    with _session() as session:
        reach = [_dataset(session, key, dataset).id] if dataset else key.reach
        docs = matching_job_documents(session, reach, conditions) if conditions else None
        found = api_queries.jobs_before(
            session=session,
            dataset_ids=reach,
            statuses=statuses,
            before_id=before,
            limit=limit + 1,
            document_ids=docs,
        )
        rows = [job_state(session, j, key) for j in found[:limit]]
    more = len(found) > limit
    return JobsPage(rows, str(rows[-1]["id"]) if more and rows else None)


def _act(key: ApiPrincipal, job_id: int, scope: Scope, verb: str) -> None:
    with _session() as session:
        _job(session, key, job_id)
    require(key, scope, verb)


def retry(key: ApiPrincipal, job_id: int) -> ActionReport:
    _act(key, job_id, "ingest", "retrying jobs")
    return actions.retry(key.operator, [job_id], reason=f"retry through the API by {key.name}")


def cancel(key: ApiPrincipal, job_id: int) -> ActionReport:
    _act(key, job_id, "ingest", "cancelling jobs")
    return actions.cancel(key.operator, [job_id])


def unlock(key: ApiPrincipal, job_id: int, password: str) -> ActionReport:
    """The console's unlock (sluice.ops.unlock): the password goes to the decrypting child only."""
    _act(key, job_id, "ingest", "unlocking files")
    return actions.retry_with_password(key.operator, job_id, password)


# --- documents ------------------------------------------------------------------------------------


def document(key: ApiPrincipal, document_id: int) -> dict[str, Any]:
    with _session() as session:
        _document(session, key, document_id)
    try:
        found = document_view.view(reads.ctx(), f"doc:{document_id}")
    except UnknownReference:
        raise Missing(f"no document {document_id}") from None
    info = found.to_dict()
    return {
        "id": info["document_id"],
        "dataset": info["dataset"],
        "filename": info["filename"],
        "sha256": info["sha256"],
        "size": info["size"],
        "media_type": info["media_type"],
        "created_at": info["created_at"],
        "deleted": info["deleted"],
        "active_job_id": info["active_job_id"],
        "chunk_count": info["chunk_count"],
        "page_count": info["page_count"],
        "metadata": info["metadata"],
        "enabled": info["enabled"],
        "disabled_at": info["disabled_at"],
        "disabled_by": info["disabled_by"],
        "jobs": info["jobs"],
        **_versions(replacing.version_state(reads.ctx(), document_id).to_dict()),
    }


def _versions(state: dict[str, Any]) -> dict[str, Any]:
    """A document's place among the versions of its external id, as the API names it."""
    state["version_state"], state["version_message"] = state.pop("state"), state.pop("message")
    return state


def chunks(key: ApiPrincipal, document_id: int, *, offset: int, limit: int) -> list[dict]:
    """The chunks search serves for the document (its active job's), in order."""
    with _session() as session:
        _document(session, key, document_id)
    rows = document_view.chunks(reads.ctx(), document_id, offset=offset, limit=limit)
    return [
        {
            "chunk_id": c.chunk_id,
            "position": c.position,
            "page": c.page,
            "text": c.text,
            "enabled": c.enabled,
        }
        for c in rows
    ]


def set_document_metadata(key: ApiPrincipal, document_id: int, metadata: Any) -> dict[str, Any]:
    """Replace a document's metadata (MetadataError names a bad key); the document after."""
    with _session() as session:
        doc = _document(session, key, document_id)
        if doc.deleted_at is not None:
            raise Missing(f"no document {document_id}")
    require(key, "ingest", "changing document metadata")
    try:
        actions.set_document_metadata(key.operator, document_id, metadata)
    except UnknownDocument:
        raise Missing(f"no document {document_id}") from None
    return document(key, document_id)


def set_document_enabled(key: ApiPrincipal, document_id: int, enabled: bool) -> dict[str, Any]:
    """Switch a live document of a dataset in reach on or off; the document after."""
    with _session() as session:
        doc = _document(session, key, document_id)
        if doc.deleted_at is not None:
            raise Missing(f"no document {document_id}")
    require(key, "ingest", "switching documents")
    try:
        state = actions.set_document_enabled(
            key.operator, document_id, enabled, dataset_ids=key.reach
        )
    except UnknownDocument:
        raise Missing(f"no document {document_id}") from None
    return document(key, state.document_id)


def list_documents(
    key: ApiPrincipal, dataset: str, *, where: dict | None, offset: int, limit: int
) -> list[dict[str, Any]]:
    """A dataset's live documents, oldest first, those ``where`` allows (sluice.ops.metadata)."""
    conditions = parse_where(where)
    with _session() as session:
        ds = _dataset(session, key, dataset)
        docs = filtered_documents(session, ds.id, conditions, offset=offset, limit=limit)
    return [
        {
            "id": d.id,
            "filename": d.filename,
            "media_type": d.media_type,
            "size": d.size,
            "created_at": as_utc(d.created_at).isoformat(timespec="seconds"),
            "active_job_id": d.active_job_id,
            "metadata": dict(d.metadata_ or {}),
        }
        for d in docs
    ]


def set_chunk_enabled(key: ApiPrincipal, chunk_id: str, enabled: bool) -> ChunkState:
    """Switch a chunk of a dataset in reach on or off."""
    require(key, "ingest", "switching chunks")
    try:
        return actions.set_chunk_enabled(key.operator, chunk_id, enabled, dataset_ids=key.reach)
    except UnknownChunk:
        raise Missing(f"no chunk {chunk_id!r}") from None


def edit_chunk(key: ApiPrincipal, chunk_id: str, text: str) -> ChunkState:
    """Give a chunk of a dataset in reach new text (embedded again)."""
    require(key, "ingest", "editing chunks")
    try:
        return actions.edit_chunk(key.operator, chunk_id, text, dataset_ids=key.reach)
    except UnknownChunk:
        raise Missing(f"no chunk {chunk_id!r}") from None


def delete_document(key: ApiPrincipal, document_id: int):
    with _session() as session:
        _document(session, key, document_id)
    require(key, "manage", "deleting documents")
    return actions.delete_document(key.operator, f"doc:{document_id}")


def documents_by_external_id(
    key: ApiPrincipal, external_id: str, dataset: str | None = None
) -> list[dict[str, Any]]:
    """The live document of ``external_id`` in each dataset in reach (or in ``dataset``)."""
    with _session() as session:
        names = (
            [_dataset(session, key, dataset).name]
            if dataset
            else [d["name"] for d in reads.dataset_summaries() if key.reaches(d["id"])]
        )
    ctx = reads.ctx()
    found = [find_by_external_id(ctx, name, external_id) for name in names]
    return [document(key, doc_id) for doc_id in found if doc_id is not None]


def delete_by_external_id(key: ApiPrincipal, dataset: str, external_id: str):
    """Every version of ``external_id`` in the dataset still there (the live one, a replacement
    being built), each by the operator's delete; Missing when there is none."""
    with _session() as session:
        _dataset(session, key, dataset)
    require(key, "manage", "deleting documents")
    done = replacing.delete_by_external_id(
        reads.ctx(),
        dataset,
        external_id,
        actor=key.operator.actor,
        delete=lambda ref: actions.delete_document(key.operator, ref),
    )
    if not done.ok and done.document is None:
        raise Missing(done.message)
    return done


# --- search ---------------------------------------------------------------------------------------


def search(key: ApiPrincipal, *, dataset: str, query: str, k: int, **filters) -> list[SearchHit]:
    """The console's and the CLI's search (sluice.ops.reads.search), of one dataset in reach."""
    with _session() as session:
        _dataset(session, key, dataset)
    return reads.search(query, dataset, k, **filters)
