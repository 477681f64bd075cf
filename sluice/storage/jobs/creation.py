"""New jobs: a job for a document, and an upload's document and job, once per bytes.

New bytes without an external id (most uploads) write their rows by INSERTs made once with bound
parameters: document, job, its ``created`` event and its outbox row, none through the unit of work
(building, flushing and keying them was most of an upload's time in the API). Everything else (the
same bytes again, a deleted document back, versions of an external id) goes through the ORM.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from typing import Any, cast

from sqlalchemy import CursorResult, bindparam, insert
from sqlalchemy import inspect as sa_inspect
from sqlalchemy import select as sql_select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import make_transient_to_detached
from sqlmodel import Session, SQLModel, select

from sluice import faults
from sluice.errors import TransientError
from sluice.storage import replacements
from sluice.storage.clock import current_time
from sluice.storage.db import stored
from sluice.storage.jobs.conditional import JOB, compare_and_set
from sluice.storage.jobs.deletion import retire_versions
from sluice.storage.jobs.event_log import add_event
from sluice.storage.jobs.operator_actions import retry
from sluice.storage.jobs.outbox_row import publish
from sluice.storage.models import Document, Job, JobStatus, Stage, utcnow

DOCUMENT = SQLModel.metadata.tables["document"]
OUTBOX = SQLModel.metadata.tables["outbox"]
# Made once (SQLAlchemy reuses their compiled form; building and keying them was per call before).
_DOCUMENT_ID = sql_select(DOCUMENT.c.id).where(
    DOCUMENT.c.dataset_id == bindparam("dataset_id"), DOCUMENT.c.sha256 == bindparam("sha256")
)
_INSERT_DOCUMENT = insert(DOCUMENT)
_INSERT_JOB = insert(JOB)
# Due at once, by the database's clock (the one clock: DESIGN.md).
_INSERT_OUTBOX = insert(OUTBOX).values(available_at=current_time())


def idempotency_key(*, dataset_id: int, sha256: str, pipeline_version: str) -> str:
    """One job per bytes, dataset and pipeline version: an upload of the same file again finds
    it."""
    return f"{dataset_id}:{sha256}:{pipeline_version}"


def create_job(
    *,
    session: Session,
    document: Document,
    pipeline_version: str,
    idempotency_key: str,
    max_attempts: int,
    actor: str = "system",
) -> tuple[Job, bool]:
    """Job(pending) + Outbox + JobEvent for a document, or the existing job for the same key.

    The caller commits; the three rows land in one transaction with the Document.
    """
    existing = session.exec(select(Job).where(Job.idempotency_key == idempotency_key)).first()
    if existing is not None:
        if existing.status == JobStatus.deleted:
            # The same bytes uploaded again after a delete: bring the job back.
            before = existing.status
            if compare_and_set(
                session,
                existing,
                status=JobStatus.pending,
                stage=Stage.queued,
                done=0,
                total=0,
                attempt=0,
                max_attempts=max_attempts,
                next_attempt_at=None,
                finished_at=None,
                cancel_requested=False,
                dismissed=False,
                error_kind=None,
                error_code=None,
                error_message=None,
                fix_hint=None,
                error_detail=None,
            ):
                add_event(
                    session,
                    existing,
                    "reuploaded",
                    actor=actor,
                    from_status=before,
                    to_status=JobStatus.pending,
                    message="uploaded again after delete",
                )
                publish(session, existing)
                return existing, True
        return existing, False
    job = Job(
        document_id=document.id,
        dataset_id=document.dataset_id,
        filename=document.filename,
        idempotency_key=idempotency_key,
        pipeline_version=pipeline_version,
        max_attempts=max_attempts,
    )
    session.add(job)
    session.flush()
    add_event(
        session,
        job,
        "created",
        actor=actor,
        to_status=JobStatus.pending,
        message=f"{document.filename} ({document.size} bytes, {document.media_type})",
    )
    publish(session, job)
    return job, True


def create_upload(
    *,
    session: Session,
    dataset_id: int,
    sha256: str,
    size: int,
    media_type: str,
    filename: str,
    pipeline_version: str,
    max_attempts: int,
    actor: str = "system",
    attempts: int = 5,
    external_id: str | None = None,
) -> tuple[Document, Job, bool]:
    """Document + Job(pending) + Outbox for uploaded bytes, committed in one transaction; or the
    document and job that already exist for the same bytes, dataset and pipeline version. Under an
    ``external_id``, new bytes are a new version of that id's document (``storage.replacements``).

    Identical uploads at the same moment all look, find nothing, and insert: the unique constraints
    let one win, and the others read again and get its job (``created`` False).
    """
    key = idempotency_key(dataset_id=dataset_id, sha256=sha256, pipeline_version=pipeline_version)
    attempt = 0
    while True:
        attempt += 1
        try:
            if external_id is None and not _known(session, dataset_id, sha256):
                faults.hit("before_document_insert", sha256=sha256)
                document = _document(dataset_id, sha256, size, media_type, filename)
                job = _commit_new(session, document, key, pipeline_version, max_attempts, actor)
                return document, job, True
            found = session.exec(
                select(Document).where(Document.dataset_id == dataset_id, Document.sha256 == sha256)
            ).first()
            new = found is None
            if found is None:
                faults.hit("before_document_insert", sha256=sha256)
                document = _document(dataset_id, sha256, size, media_type, filename)
                session.add(document)
                session.flush()
            else:
                document = found
                if document.deleted_at is not None and document.blob_key != sha256:
                    # A deleted document comes back with the bytes just stored: its own blob may
                    # be gone (an unlocked document's decrypted copy, removed by the delete).
                    document.blob_key = sha256
                    session.add(document)
            if not _placed(session, document, external_id=external_id, new=new, actor=actor):
                session.rollback()  # an earlier version's job changed meanwhile: read again
                _contended(external_id, attempt, attempts)
                continue
            job, created = create_job(
                session=session,
                document=document,
                pipeline_version=pipeline_version,
                idempotency_key=key,
                max_attempts=max_attempts,
                actor=actor,
            )
            if not created and job.status == JobStatus.failed and job.error_code == "blob_missing":
                # Its hint said "upload the file again": these are its bytes, stored just now.
                document.blob_key = sha256
                session.add(document)
                session.flush()
                [done] = retry(
                    session=session, job_ids=[job.id], actor=actor, reason="file uploaded again"
                )
                return document, stored(session, Job, job.id, populate_existing=True), done.ok
            session.commit()
            return document, job, created
        except IntegrityError:
            session.rollback()  # another upload of the same bytes won the insert; read its rows
            if attempt >= attempts:
                raise


def _document(dataset_id: int, sha256: str, size: int, media_type: str, filename: str) -> Document:
    """A new document of uploaded bytes (its blob is named by their hash)."""
    return Document(
        dataset_id=dataset_id,
        sha256=sha256,
        size=size,
        media_type=media_type,
        filename=filename,
        blob_key=sha256,
    )


def _placed(
    session: Session, document: Document, *, external_id: str | None, new: bool, actor: str
) -> bool:
    """The upload's document placed among the versions of its external id, the earlier candidates
    it supersedes deleted (False: a compare-and-set was lost; roll back and read again)."""
    earlier = replacements.place(session, document=document, external_id=external_id, new=new)
    return retire_versions(session, earlier, by=document, actor=actor) is not None


def _contended(external_id: str | None, attempt: int, attempts: int) -> None:
    if attempt >= attempts:
        raise TransientError(
            "upload_contended",
            f"the versions of {external_id!r} kept changing ({attempts} tries)",
            "Upload it again.",
        )


_SQLITE_WRITES = threading.Lock()


@contextmanager
def _one_writer(session: Session) -> Iterator[None]:
    """On SQLite, this process's upload transactions one at a time. SQLite has one writer; a
    connection that finds the lock taken sleeps in its busy handler (1 ms, then up to 100 ms a try)
    and misses the moment it is free, so concurrent uploads (the API's threads) waited far longer
    than the writes took. Here the next one is woken by the commit before it. Other writers (other
    processes, other transitions) still meet SQLite's own lock."""
    if session.get_bind().dialect.name != "sqlite":
        yield
        return
    with _SQLITE_WRITES:
        yield


def _known(session: Session, dataset_id: int, sha256: str) -> bool:
    """Does the dataset have a document of these bytes (deleted or not)?"""
    found = session.execute(_DOCUMENT_ID, {"dataset_id": dataset_id, "sha256": sha256}).first()
    return found is not None


def _commit_new(
    session: Session,
    document: Document,
    key: str,
    pipeline_version: str,
    max_attempts: int,
    actor: str,
) -> Job:
    """``_insert_new``, committed (one upload at a time on SQLite: ``_one_writer``)."""
    with _one_writer(session):
        job = _insert_new(
            session,
            document,
            idempotency_key=key,
            pipeline_version=pipeline_version,
            max_attempts=max_attempts,
            actor=actor,
        )
        session.commit()
    return job


def _insert_new(
    session: Session,
    document: Document,
    *,
    idempotency_key: str,
    pipeline_version: str,
    max_attempts: int,
    actor: str,
) -> Job:
    """The rows of bytes new to the dataset: ``document``, its Job(pending), the job's ``created``
    event and its outbox row, one INSERT each; the caller commits. No job can hold the key yet: a
    job's key names its document's bytes, and they had no document. ``document`` and the job are
    then the session's own, as if read (the audit trail looks them up), without a statement."""
    document.id = _inserted(session, _INSERT_DOCUMENT, document)
    job = Job(
        document_id=document.id,
        dataset_id=document.dataset_id,
        filename=document.filename,
        idempotency_key=idempotency_key,
        pipeline_version=pipeline_version,
        max_attempts=max_attempts,
    )
    job.id = _inserted(session, _INSERT_JOB, job)
    for row in (document, job):
        make_transient_to_detached(row)
        session.add(row)
    try:
        add_event(
            session,
            job,
            "created",
            actor=actor,
            to_status=JobStatus.pending,
            message=f"{document.filename} ({document.size} bytes, {document.media_type})",
        )
        outbox = {"job_id": job.id, "dataset_id": job.dataset_id, "created_at": utcnow()}
        session.execute(_INSERT_OUTBOX, outbox)
    except BaseException:
        for row in (document, job):  # rows of a transaction that will not commit: not the session's
            session.expunge(row)
        raise
    return job


def _inserted(session: Session, statement: Any, row: SQLModel) -> int:
    """Insert ``row``'s values (its defaults filled in when it was built) by ``statement``; its
    id."""
    values = {column: getattr(row, attr) for attr, column in _columns(type(row))}
    key = cast(CursorResult[Any], session.execute(statement, values)).inserted_primary_key
    assert key is not None
    return int(key[0])


@cache
def _columns(model: type[SQLModel]) -> tuple[tuple[str, str], ...]:
    """(attribute, column) of every column of ``model`` but its id."""
    return tuple(
        (prop.key, prop.columns[0].name)
        for prop in sa_inspect(model).column_attrs
        if prop.columns[0].name != "id"
    )
