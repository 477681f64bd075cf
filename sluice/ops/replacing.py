"""External ids: the check every front end uses, versions of a document, and what a replacement
leaves behind.

New bytes uploaded under a known external id are a new version of that document
(``sluice.storage.replacements``): the old version serves until the new one's job succeeds, then
one transaction switches them, and the runner removes the old chunks. A replacement that fails or
is cancelled leaves the old version serving; ``version_state`` says so for the document and job
views and the API.
"""

from __future__ import annotations

import logging
import unicodedata
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial

from sqlmodel import Session, col, select

from sluice.errors import OperationError
from sluice.ops.documents import DeleteResult, delete_document
from sluice.pipeline.running.cleanup import remove_replaced_blobs
from sluice.pipeline.running.context import Context
from sluice.storage import lexical, replacements
from sluice.storage.clock import as_utc
from sluice.storage.db import stored
from sluice.storage.models import Dataset, Document, Job, JobStatus

log = logging.getLogger(__name__)

MAX_EXTERNAL_ID = 512
EXTERNAL_ID_RULE = "An external id is 1 to 512 characters, none of them a control character."
# The rule as a JSON Schema ``pattern`` (the API's schema publishes it): no control character (Cc:
# U+0000-U+001F, U+007F-U+009F) and no lone surrogate (Cs); ``check_external_id`` decides the same.
EXTERNAL_ID_PATTERN = r"^[^\x00-\x1f\x7f-\x9f\ud800-\udfff]{1,512}$"


class BadExternalId(OperationError):
    """An external id Sluice refuses; ``code`` is the stable code front ends show."""

    code, status = "bad_external_id", 422
    hint = EXTERNAL_ID_RULE


def check_external_id(value: str | None) -> str | None:
    """The external id as given (None: the upload has none); BadExternalId naming what is wrong."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise BadExternalId(f"external_id must be a string, not {type(value).__name__}")
    if not value:
        raise BadExternalId("external_id is empty")
    if len(value) > MAX_EXTERNAL_ID:
        raise BadExternalId(f"external_id is {len(value)} characters long, over {MAX_EXTERNAL_ID}")
    bad = next((ch for ch in value if unicodedata.category(ch) in ("Cc", "Cs")), None)
    if bad is not None:
        raise BadExternalId(f"external_id holds the control character U+{ord(bad):04X}")
    return value


@dataclass
class VersionState:
    """Where a document stands among the versions of its external id."""

    external_id: str | None
    version: int | None
    # serving, failed, replacing, replacement_failed, replaced, superseded, deleted; "" (no id)
    state: str
    message: str
    replaces_document_id: int | None = None
    replaced_by: int | None = None
    serving_document_id: int | None = None
    serving_version: int | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def version_state(ctx: Context, document_id: int) -> VersionState:
    """The version a document is and what became of it: the line the document and job views show
    ("replacement failed; version 1 still serving")."""
    with Session(ctx.engine) as session:
        doc = stored(session, Document, document_id)
        if doc.external_id is None:
            return VersionState(None, None, "", "")
        serving = replacements.live(session, dataset_id=doc.dataset_id, external_id=doc.external_id)
        job = session.exec(
            select(Job).where(Job.document_id == doc.id).order_by(col(Job.id).desc())
        ).first()
        by = session.get(Document, doc.replaced_by) if doc.replaced_by is not None else None
        pending = _pending(session, doc)
    state = VersionState(
        doc.external_id,
        doc.doc_version,
        "",
        "",
        replaces_document_id=doc.replaces_document_id,
        replaced_by=doc.replaced_by,
        serving_document_id=serving.id if serving else None,
        serving_version=serving.doc_version if serving else None,
    )
    still = f"version {serving.doc_version} still serving" if serving else "no version serving"
    unbuilt = job is not None and job.status in (JobStatus.failed, JobStatus.cancelled)
    if serving is not None and serving.id == doc.id and doc.active_job_id is None and unbuilt:
        assert job is not None
        state.state = "failed"  # the newest version, but no job of it ever served search
        state.message = f"version {doc.doc_version} {job.status.value}: no version serving"
    elif serving is not None and serving.id == doc.id:
        state.state, state.message = "serving", f"version {doc.doc_version} (live)"
        if pending is not None:
            state.message += f"; version {pending[0]} {pending[1]}"
    elif by is not None and by.replaces_document_id != doc.id:
        state.state = "superseded"
        state.message = f"superseded by a newer upload (document {doc.replaced_by}); {still}"
    elif doc.replaced_by is not None:
        state.state = "replaced"
        state.message = f"replaced by document {doc.replaced_by}; {still}"
    elif doc.deleted_at is not None:
        state.state, state.message = "deleted", "deleted"
    elif job is not None and job.status in (JobStatus.failed, JobStatus.cancelled):
        state.state = "replacement_failed"
        state.message = f"replacement {job.status.value}; {still}"
    else:
        state.state = "replacing"
        state.message = f"version {doc.doc_version} is being built; {still}"
    return state


@dataclass
class JobVersion:
    """Where one job stands among its document's versions: the Document page's "serves search"
    and version line, for one job (the Jobs page and ``sluice show JOB``)."""

    serves_search: bool  # the document's active job: the one search answers from
    serving_job_id: int | None  # the job search serves for this document (or its live version)
    replaced_by_job: int | None  # a job that was built, no longer serving: the later one serving
    version_state: str  # VersionState.state: serving, replacement_failed, replaced, ... or ""
    version_message: str  # the document's version line (an external id's), or ""
    message: str  # what the job is to search, in words

    def to_dict(self) -> dict:
        return asdict(self)


def job_version(ctx: Context, job_id: int) -> JobVersion | None:
    """The job's place among its document's versions (None: no such job)."""
    with Session(ctx.engine) as session:
        job = session.get(Job, job_id)
        doc = session.get(Document, job.document_id) if job is not None else None
        if job is None or doc is None:
            return None
    version = version_state(ctx, doc.id)
    with Session(ctx.engine) as session:
        live = session.get(Document, version.serving_document_id or doc.id)
        serving = live.active_job_id if live is not None and live.deleted_at is None else None
    built = job.status in (JobStatus.succeeded, JobStatus.superseded, JobStatus.deleted)
    replaced_by = serving if built and serving is not None and serving > job.id else None
    if serving == job.id:
        message = "serves search (the document's active job)"
    elif replaced_by is not None:
        message = f"replaced by job {replaced_by}, which serves search now"
    elif serving is not None:
        message = f"does not serve search: job {serving} does"
    else:
        gone = ": the document was deleted" if doc.deleted_at is not None else ""
        message = f"does not serve search{gone}"
    if version.message:
        message += f"; external id {version.external_id}: {version.message}"
    return JobVersion(
        serving == job.id, serving, replaced_by, version.state, version.message, message
    )


def _pending(session: Session, doc: Document) -> tuple[int | None, str] | None:
    """The replacement of ``doc`` not serving yet, as (its version, how it stands), or None."""
    if doc.external_id is None:
        return None
    found = replacements.candidate(session, dataset_id=doc.dataset_id, external_id=doc.external_id)
    if found is None or found.id == doc.id:
        return None
    job = session.exec(
        select(Job).where(Job.document_id == found.id).order_by(col(Job.id).desc())
    ).first()
    if job is not None and job.status in (JobStatus.failed, JobStatus.cancelled):
        return found.doc_version, f"(replacement) {job.status.value}"
    return found.doc_version, "(replacement) being built"


def remove_superseded(ctx: Context, document_id: int) -> int:
    """After an upload: remove the chunks and blobs of the earlier candidates it superseded (their
    jobs are deleted; a worker still writing stops at its next batch, and reconcile removes what it
    wrote after this). The number of jobs whose chunks were removed."""
    with Session(ctx.engine) as session:
        docs = session.exec(
            select(Document).where(
                Document.replaced_by == document_id, col(Document.deleted_at).is_not(None)
            )
        ).all()
        if not docs:
            return 0
        collection = stored(session, Dataset, docs[0].dataset_id).collection
        job_ids = list(
            session.exec(
                select(col(Job.id)).where(col(Job.document_id).in_([d.id for d in docs]))
            ).all()
        )
    if job_ids:
        try:
            ctx.vectors.delete(collection, where={"job_id": {"$in": job_ids}})
            lexical.delete_jobs(ctx.engine, job_ids)
        except Exception as exc:  # search already ignores them; reconcile removes them later
            log.warning("chunks of superseded versions %s not removed: %s", job_ids, exc)
    remove_replaced_blobs(ctx, document_id)
    return len(job_ids)


def version_rows(ctx: Context, document_id: int) -> list[dict]:
    """Every version of the document's external id, oldest first, each with what it is now
    (live, replaced, being built, failed, deleted): the Document page's list of versions."""
    with Session(ctx.engine) as session:
        doc = stored(session, Document, document_id)
        if doc.external_id is None:
            return []
        docs = replacements.versions(
            session, dataset_id=doc.dataset_id, external_id=doc.external_id
        )
        serving = replacements.live(session, dataset_id=doc.dataset_id, external_id=doc.external_id)
    rows = []
    for d in docs:
        if serving is not None and d.id == serving.id and d.active_job_id is not None:
            state = "live"
        elif d.replaced_by is not None:
            state = f"replaced by document {d.replaced_by}"
        elif d.deleted_at is not None:
            state = "deleted"
        elif d.active_job_id is None:
            state = "not serving (being built, or its job failed)"
        else:
            state = "serving"
        rows.append(
            {
                "document": d.id,
                "version": d.doc_version,
                "state": state,
                "uploaded": as_utc(d.created_at).isoformat(timespec="seconds"),
                "this page": d.id == document_id,
            }
        )
    return rows


def alive_versions(ctx: Context, dataset: str, external_id: str) -> list[int]:
    """The documents of ``external_id`` not deleted yet: the live one and a candidate, if any."""
    with Session(ctx.engine) as session:
        ds = session.exec(select(Dataset).where(Dataset.name == dataset)).first()
        if ds is None:
            return []
        return [
            d.id
            for d in replacements.versions(session, dataset_id=ds.id, external_id=external_id)
            if d.deleted_at is None and d.replaced_by is None
        ]


def delete_by_external_id(
    ctx: Context,
    dataset: str,
    external_id: str,
    *,
    actor: str,
    delete: Callable[[str], DeleteResult] | None = None,
) -> DeleteResult:
    """Delete the document ``external_id`` names in ``dataset``: the version serving and a
    replacement still being built, each by ``delete`` (a reference ``doc:N`` to its result; a front
    end passes its operator's delete). ``ok`` False and no ``document`` when there is none."""
    found = alive_versions(ctx, dataset, external_id)
    if not found:
        return DeleteResult(False, f"no document with external id {external_id!r} in {dataset!r}")
    results = [
        (delete or partial(delete_document, ctx, actor=actor))(f"doc:{doc_id}") for doc_id in found
    ]
    first = results[0]
    for more in results[1:]:
        first.ok = first.ok and more.ok
        first.message += "; " + more.message
        first.vectors_removed += more.vectors_removed
        first.jobs_deleted += more.jobs_deleted
        first.blob_removed = first.blob_removed or more.blob_removed
    return first
