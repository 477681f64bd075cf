"""New jobs: a job for a document, and an upload's document and job, once per bytes."""

from __future__ import annotations

from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, select

from sluice import faults
from sluice.errors import TransientError
from sluice.storage import replacements
from sluice.storage.db import stored
from sluice.storage.jobs.conditional import compare_and_set
from sluice.storage.jobs.deletion import retire_versions
from sluice.storage.jobs.event_log import add_event
from sluice.storage.jobs.operator_actions import retry
from sluice.storage.jobs.outbox_row import publish
from sluice.storage.models import Document, Job, JobStatus, Stage


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
            document = session.exec(
                select(Document).where(Document.dataset_id == dataset_id, Document.sha256 == sha256)
            ).first()
            new = document is None
            if document is None:
                faults.hit("before_document_insert", sha256=sha256)
                document = Document(
                    dataset_id=dataset_id,
                    sha256=sha256,
                    size=size,
                    media_type=media_type,
                    filename=filename,
                    blob_key=sha256,
                )
                session.add(document)
                session.flush()
            elif document.deleted_at is not None and document.blob_key != sha256:
                # A deleted document comes back with the bytes just stored: its own blob may be
                # gone (an unlocked document's decrypted copy, removed by the delete).
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
