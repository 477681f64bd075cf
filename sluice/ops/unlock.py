"""Unlocking a password-protected PDF: the operator gives the password, the job continues.

The password lives only in the memory of the process that receives it (the console's or the
``sluice`` command's) and of the child process that opens the file, which reads it on its stdin.
That child writes the PDF without its encryption; the decrypted bytes become the document's blob,
and the document keeps the sha256 of the file as uploaded (its identity: uploading the locked file
again finds this document). Then the job is retried like any other, and the worker reads the
decrypted blob. Nothing that a job, an event, the queue or a log holds ever carries the password;
docs/passwords.md says why each store is safe.
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

from sqlalchemy import update
from sqlmodel import Session, col

from sluice import faults
from sluice.errors import PipelineError
from sluice.files import private_dir
from sluice.ops.documents import remove_blob_if_unused
from sluice.pipeline.parsing.parse import PDF, ParseLimits, decrypt_pdf
from sluice.pipeline.running.context import Context
from sluice.storage import jobs
from sluice.storage.blobs import Received
from sluice.storage.db import matched, stored
from sluice.storage.jobs import ActionResult
from sluice.storage.models import Document, Job, JobStatus

log = logging.getLogger(__name__)

LOCKED_CODES = ("password_protected", "wrong_password")  # failed jobs that a password unlocks


def _decrypt(
    ctx: Context, job_id: int, document: Document, password: str, *, actor: str
) -> Received | ActionResult:
    """The decrypted PDF stored as a blob (held until the document names it), or the refusal."""
    scratch = private_dir(ctx.settings.data_dir / "blob-scratch")
    with ctx.blobs.local_copy(document.blob_key) as source:
        fd, tmp = tempfile.mkstemp(dir=scratch, prefix=".unlock-", suffix=".pdf")
        os.close(fd)
        try:
            try:
                decrypt_pdf(
                    source,
                    password,
                    Path(tmp),
                    limits=ParseLimits.from_settings(ctx.settings),
                    name=document.filename,
                )
            except PipelineError as exc:
                with Session(ctx.engine) as session:
                    jobs.action_rejected(
                        session=session,
                        job_id=job_id,
                        actor=actor,
                        code=exc.code,
                        message=exc.message,
                        hint=exc.hint,
                    )
                return ActionResult(job_id, False, f"job {job_id}: {exc.message}")
            with open(tmp, "rb") as fh:
                limit = max(ctx.settings.max_upload_bytes * 4, 1 << 20)
                return ctx.blobs.receive(fh, max_bytes=limit)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)


def unlock_and_retry(ctx: Context, job_id: int, password: str, *, actor: str) -> ActionResult:
    """Decrypt the job's document with ``password`` and queue the job again; a wrong password
    leaves the job failed, saying "wrong password"."""
    with Session(ctx.engine, expire_on_commit=False) as session:
        job = session.get(Job, job_id)
        document = session.get(Document, job.document_id) if job is not None else None
    if job is None or document is None:
        return ActionResult(job_id, False, f"job {job_id} does not exist")
    if (
        job.status != JobStatus.failed
        or job.error_code not in LOCKED_CODES
        or document.media_type != PDF
    ):
        return ActionResult(
            job_id,
            False,
            f"job {job_id} is not waiting for a password (it is {job.status.value}"
            + (f", {job.error_code}" if job.error_code else "")
            + ")",
        )
    if not password:
        return ActionResult(job_id, False, "no password given")
    decrypted = _decrypt(ctx, job_id, document, password, actor=actor)
    if isinstance(decrypted, ActionResult):
        return decrypted
    old = document.blob_key
    try:
        faults.hit("unlock_decrypted", job_id=job_id)
        with Session(ctx.engine) as session:
            switched = (
                matched(
                    session,
                    update(Document)
                    .where(col(Document.id) == document.id, col(Document.blob_key) == old)
                    .values(blob_key=decrypted.key),
                )
                == 1
            )
            session.commit()
    except BaseException:
        ctx.blobs.release(decrypted.held)
        raise
    ctx.blobs.keep(decrypted.key, decrypted.held)  # a delete of these bytes cannot take them
    if switched:
        remove_blob_if_unused(ctx, old)  # the locked bytes, unless another document reads them
    with Session(ctx.engine) as session:
        jobs.add_event(
            session,
            stored(session, Job, job_id),
            "unlocked",
            actor=actor,
            message="password given; the document's blob is now the decrypted PDF "
            "(the document keeps the uploaded file's sha256)",
        )
        session.commit()
        result = jobs.retry(
            session=session, job_ids=[job_id], actor=actor, reason="password given"
        )[0]
        now = stored(session, Job, job_id, populate_existing=True)
        if not result.ok and now.status in (*jobs.CLAIMABLE, JobStatus.running):
            # Another operator's retry queued it meanwhile: its run reads the decrypted file.
            result = ActionResult(
                job_id, True, f"job {job_id} unlocked; it is already {now.status.value} again"
            )
    log.info("job %s: unlocked by %s; %s", job_id, actor, result.message)
    return result
