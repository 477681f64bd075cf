"""running -> succeeded: the job becomes its document's searchable one, in one transaction."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

from sqlalchemy import bindparam, update
from sqlmodel import Session, SQLModel, col, select

from sluice import faults
from sluice.errors import JobCancelled, LeaseLost, TransientError
from sluice.storage import chunk_edits, replacements, source_records, webhook_records
from sluice.storage.jobs.conditional import (
    IN_STATUS,
    RUNNING_UNCANCELLED,
    compare_and_set,
    matched_made_once,
)
from sluice.storage.jobs.deletion import retire_versions
from sluice.storage.jobs.event_log import add_event
from sluice.storage.jobs.job_values import Built
from sluice.storage.jobs.lookups import read_job
from sluice.storage.jobs.statuses import SUPERSEDABLE
from sluice.storage.models import Document, Job, JobStatus, Stage


def succeed(
    *,
    session: Session,
    job_id: int,
    lease: int,
    worker_id: str,
    built: Built,
    attempts: int = 5,
    read: Callable[[Document], None] | None = None,
) -> list[int]:
    """running -> succeeded; makes this job the document's searchable one. Each of ``built``'s
    warnings is a ``warning`` event of the job; its seconds per stage go into the success event.

    A cancel requested before this lands wins: JobCancelled is raised, and the worker removes the
    vectors and records the job cancelled (LeaseLost when the job is no longer this attempt's).

    Every other job of the document that serves search or may still run (another pipeline
    version: succeeded, pending, running, retrying) becomes superseded in the same transaction, by
    compare-and-set: an older version's job still running on an old worker can then never finish
    later and take search back. A lost compare-and-set reads again and tries again; nothing is
    written unless all of it is. Returns the ids of the superseded jobs (the caller removes their
    chunks). ``read`` is called with the document as the transaction that succeeded read it.
    """
    for _ in range(attempts):
        superseded = _succeed_once(session, job_id, lease, worker_id, built, read)
        if superseded is not None:
            return superseded
    raise TransientError(
        "success_contended",
        f"job {job_id} could not record its success: the document's "
        f"jobs kept changing ({attempts} tries)",
        "Sluice retries this by itself.",
    )


def _succeed_once(
    session: Session,
    job_id: int,
    lease: int,
    worker_id: str,
    built: Built,
    seen: Callable[[Document], None] | None,
) -> list[int] | None:
    """One try of ``succeed``: the ids it superseded, or None when a compare-and-set was lost and
    nothing was written (read again and try again)."""
    found = read_job(session, job_id)
    if found is None or found.job.lease != lease or found.job.status != JobStatus.running:
        session.rollback()
        raise LeaseLost(f"job {job_id} is no longer owned by lease {lease}")
    job, now, document = found.job, found.now, found.document
    if job.cancel_requested:
        session.rollback()
        raise JobCancelled()
    if document is None:
        raise LookupError(f"no Document {job.document_id!r}")
    if built.edits_seen is not None and (document.last_edit_id or 0) != built.edits_seen:
        session.rollback()  # a chunk edit landed since the run read them: it applies it first
        raise chunk_edits.ChunkEdited(document.id, document.last_edit_id or 0)
    serving = document.active_job_id
    hidden = document.deleted_at is not None  # a source's removal stays: see _make_active
    others = (  # the read said whether there are any
        session.scalars(_OTHERS, {"document_id": job.document_id, "job_id": job_id}).all()
        if found.others
        else []
    )
    faults.hit("before_supersede", job_id=job_id)
    if not _mark_succeeded(session, job, lease, now=now, built=built):
        session.rollback()
        return None  # a beat of our own heartbeat, a cancel, or a reaper: read again and see
    # Whether a source's tombstone still hides the document is read inside the writing
    # transaction, its entries held (SQLite: the write lock is ours): an undo that committed since
    # the read above is seen, and one still to come waits for this commit and then finds the job.
    keep_hidden = hidden and source_records.is_tombstoned(session, document.id, lock=True)
    _record_success(session, job, worker_id, built)
    superseded, lost = _supersede(session, job, others, now=now)
    older = replacements.others_to_retire(session, document)
    retired = retire_versions(session, older, by=document, actor=worker_id, now=now)
    switched = _make_active(
        session,
        document,
        job,
        serving=serving,
        hidden=hidden,
        keep_hidden=keep_hidden,
        last_edit=built.edits_seen,
    )
    if lost or retired is None or not switched:
        session.rollback()
        return None
    session.commit()
    if seen is not None:
        seen(document)
    return superseded + retired


_OTHERS = (
    select(Job)
    .where(
        col(Job.document_id) == bindparam("document_id"),
        col(Job.id) != bindparam("job_id"),
        col(Job.status).in_(SUPERSEDABLE),
    )
    .order_by(col(Job.id))
    .execution_options(populate_existing=True)
)
"""The document's other jobs a success may supersede, read fresh."""


def _record_success(session: Session, job: Job, worker_id: str, built: Built) -> None:
    """The success event (with its webhook) and one ``warning`` event per warning."""
    logged = add_event(
        session,
        job,
        "succeeded",
        actor=worker_id,
        from_status=JobStatus.running,
        to_status=JobStatus.succeeded,
        message=f"{built.chunks} chunks from {built.pages} pages ({built.embedded} embedded, "
        f"{built.cached} from cache)",
        data={
            "chunks": built.chunks,
            "pages": built.pages,
            "embedded": built.embedded,
            "cached": built.cached,
            "warnings": len(built.warnings),
            "stages": dict(built.stages),
        },
    )
    webhook_records.record(session, job, "job.succeeded", logged=logged)
    for text in built.warnings:
        add_event(session, job, "warning", actor=worker_id, message=text)


def _mark_succeeded(session: Session, job: Job, lease: int, *, now: datetime, built: Built) -> bool:
    """running -> succeeded, fenced on the lease and on no cancel having been requested."""
    return compare_and_set(
        session,
        job,
        RUNNING_UNCANCELLED,
        bound={"w_lease": lease},
        status=JobStatus.succeeded,
        stage=Stage.done,
        done=built.chunks,
        total=built.chunks,
        chunk_count=built.chunks,
        page_count=built.pages,
        finished_at=now,
        heartbeat_at=now,
        error_kind=None,
        error_code=None,
        error_message=None,
        fix_hint=None,
        error_detail=None,
        embedded_count=built.embedded,
        cached_count=built.cached,
        waiting_for=None,
        waiting_since=None,
        now=now,
    )


def _supersede(
    session: Session, job: Job, others: Sequence[Job], *, now: datetime
) -> tuple[list[int], bool]:
    """Each of ``others`` -> superseded by ``job``, by compare-and-set: (the ids superseded,
    whether one compare-and-set was lost, where it stops)."""
    superseded: list[int] = []
    for old in others:
        before = old.status
        if not compare_and_set(
            session,
            old,
            IN_STATUS,
            bound={"w_status": before},
            status=JobStatus.superseded,
            cancel_requested=False,
            worker_id=None,
            next_attempt_at=None,
            waiting_for=None,
            waiting_since=None,
            finished_at=old.finished_at or now,
            now=now,
        ):
            return superseded, True
        add_event(
            session,
            old,
            "superseded",
            from_status=before,
            to_status=JobStatus.superseded,
            message=f"job {job.id} (pipeline {job.pipeline_version}) now serves search",
            data={"by_job": job.id},
        )
        superseded.append(old.id)
    return superseded, False


def _make_active(
    session: Session,
    document: Document,
    job: Job,
    *,
    serving: int | None,
    hidden: bool = False,
    keep_hidden: bool = False,
    last_edit: int | None = None,
) -> bool:
    """The document's searchable job becomes ``job``, if it is still ``serving`` and still as
    ``hidden`` as when read (compare-and-set). A deleted document uploaded again comes back; one
    a source's sync tombstoned (``keep_hidden``) stays out of search: the removal wins, and the
    job's chunks wait for ``sluice sources undo`` like its other kept chunks. ``last_edit``: the
    newest chunk edit the run applied (0: none); an edit since fails the compare-and-set (None:
    not compared)."""
    edit = "any" if last_edit is None else "none" if last_edit == 0 else "one"
    stmt = _make_active_statement(serving is None, hidden, keep_hidden, edit)
    params = {"w_id": document.id, "w_serving": serving, "v_job": job.id, "w_edit": last_edit}
    return matched_made_once(session, stmt, params) == 1


@lru_cache(maxsize=8)
def _make_active_statement(unserved: bool, hidden: bool, keep_hidden: bool, edit: str) -> Any:
    """``_make_active``'s compare-and-set on the document table, made once per shape."""
    doc = SQLModel.metadata.tables["document"]
    serving = doc.c.active_job_id
    where = [
        doc.c.id == bindparam("w_id"),
        serving.is_(None) if unserved else serving == bindparam("w_serving"),
    ]
    if not hidden or keep_hidden:  # a removal landing since the read: read again, decide again
        where.append(doc.c.deleted_at.is_not(None) if hidden else doc.c.deleted_at.is_(None))
    if edit != "any":  # a chunk edit landing since the run read them: read again, refuse then
        last = doc.c.last_edit_id
        where.append(last.is_(None) if edit == "none" else last == bindparam("w_edit"))
    values: dict[str, Any] = {"active_job_id": bindparam("v_job")}
    if not keep_hidden:
        values["deleted_at"] = None
    return update(doc).where(*where).values(values)
