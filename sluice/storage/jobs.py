"""The job state machine: every transition of a job lives here.

Every update is compare-and-set: on ``version`` for operator and claim transitions, and on the
fencing token ``lease`` (plus status running) for what a worker writes during its attempt. A
transition that loses the race changes nothing and says so. Each transition writes a JobEvent in
the same transaction; transitions that need the job published again write an Outbox row too, and
the final ones (succeeded, failed, cancelled) their webhook events (``storage.webhooks``).

    pending ──claim──▶ running ──succeed──▶ succeeded ──reindex──▶ pending
       ▲                 │ fail(transient, budget left) ▶ retrying ──claim──▶ running
       │                 │ fail(otherwise) ▶ failed (dead letter) ──retry──▶ pending
       │                 │ cancel_requested ▶ cancelled ──retry──▶ pending
       └── retry ────────┘ reaper: heartbeat older than the lease = transient failure
       └──── hand_back (the worker stops in order; attempt not counted) ◀── running
    succeeded ──a newer pipeline version of the document succeeds──▶ superseded ──revive──▶ pending
    any ──mark_deleted (the document is deleted)──▶ deleted
        ──the same bytes uploaded again──▶ pending
    a waiting rebuild of the active job ──its dataset's settings change──▶ succeeded
        (rebuild dropped)
    running, of a version no worker makes ──follow_version──▶ running (the version in force), or
        succeeded (it was the active job's rebuild), or superseded (that version has its own job)
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any

from sqlalchemy import bindparam, func, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm.attributes import set_committed_value
from sqlmodel import Session, SQLModel, col, select

from sluice import faults
from sluice.errors import ErrorKind, JobCancelled, LeaseLost, TransientError
from sluice.storage import models, pauses, replacements, source_records, webhook_records
from sluice.storage.clock import as_utc, current_time, db_now
from sluice.storage.db import matched, stored
from sluice.storage.models import (
    STAGE_UNITS,
    Dataset,
    Document,
    Instance,
    Job,
    JobEvent,
    JobStatus,
    Outbox,
    Stage,
)

CLAIMABLE = (JobStatus.pending, JobStatus.retrying)
MAX_ID = 2**31 - 1  # job ids are an INTEGER column
RETRYABLE = (JobStatus.failed, JobStatus.cancelled)
CANCELLABLE = (JobStatus.pending, JobStatus.retrying, JobStatus.running)


@dataclass(frozen=True)
class ClaimResult:
    job: Job | None
    claimed: bool
    reason: str = ""
    # read with the claim, as they were then (a claim that holds has them)
    document: Document | None = None
    dataset: Dataset | None = None


@dataclass(frozen=True)
class ActionResult:
    job_id: int
    ok: bool
    message: str


def describe_progress(stage: Stage | str, done: int, total: int) -> str:
    stage = Stage(stage)
    unit = STAGE_UNITS.get(stage)
    if unit and total:
        return f"{stage.value} {done}/{total} {unit}"
    return stage.value


def backoff_delay(
    attempt: int, *, base: float, cap: float, rng: random.Random | None = None
) -> tuple[float, float]:
    """Exponential backoff with full jitter: returns (ceiling, drawn delay) for a failed attempt."""
    ceiling = min(cap, base * (2 ** max(0, attempt - 1)))
    return ceiling, (rng or random).uniform(0, ceiling)


def add_event(
    session: Session,
    job: Job,
    kind: str,
    *,
    message: str = "",
    actor: str = "system",
    from_status: JobStatus | str | None = None,
    to_status: JobStatus | str | None = None,
    data: dict[str, Any] | None = None,
) -> JobEvent:
    event = JobEvent(
        job_id=job.id,
        kind=kind,
        message=message,
        actor=actor,
        from_status=_val(from_status),
        to_status=_val(to_status),
        stage=_val(job.stage),
        attempt=job.attempt,
        data=data or {},
    )
    session.add(event)
    return event


def _val(v: Any) -> Any:
    return v.value if hasattr(v, "value") else v


JOB = SQLModel.metadata.tables["job"]
"""The job table itself. The hot path's statements are made on it once, with bound parameters: an
UPDATE of the table skips the ORM's bulk-update machinery, and a statement made once is neither
built nor keyed again on each call (together about a third of the time a small job's worker thread
held the GIL went to these)."""


@dataclass(frozen=True, eq=False)
class Guard:
    """Conditions of a compare-and-set, made once on ``JOB``'s columns, their values bound
    parameters named ``w_*`` (given as ``bound``). Its UPDATE statements are kept per set of columns
    written."""

    clauses: tuple[Any, ...]
    statements: dict[tuple[str, ...], Any] = field(default_factory=dict, repr=False)

    def statement(self, keys: tuple[str, ...]) -> Any:
        stmt = self.statements.get(keys)
        if stmt is None:  # two threads may both make it: the same statement, one kept
            stmt = self.statements[keys] = (
                update(JOB)
                .where(
                    JOB.c.id == bindparam("c_id"),
                    JOB.c.version == bindparam("c_version"),
                    *self.clauses,
                )
                .values({**{k: bindparam(f"v_{k}") for k in keys}, "version": bindparam("c_next")})
            )
        return stmt


CLAIMABLE_NOW = Guard((JOB.c.status.in_(CLAIMABLE),))
CLAIMABLE_UNPAUSED = Guard((JOB.c.status.in_(CLAIMABLE), ~pauses.covering(JOB.c.dataset_id)))
RUNNING_UNCANCELLED = Guard(
    (
        JOB.c.lease == bindparam("w_lease"),
        JOB.c.status == JobStatus.running,
        JOB.c.cancel_requested.is_(False),
    )
)


def _matched_made_once(session: Session, statement: Any, params: dict[str, Any]) -> int:
    """The rows a statement made once on a table matched. What the session holds is written first,
    as an ORM statement's autoflush would have, so a transaction writes in the same order."""
    session.flush()
    return matched(session, statement, params)


def _cas(
    session: Session,
    job: Job,
    *,
    where: Sequence[Any] | Guard = (),
    bound: dict[str, Any] | None = None,
    now: datetime | None = None,
    **values: Any,
) -> bool:
    """Update ``job`` only if its version is still the one we read; refresh the object on
    success. ``where`` adds conditions: a ``Guard`` (made once; ``bound`` gives its parameters) or
    clauses of this call."""
    values.setdefault("updated_at", now or db_now(session))
    if isinstance(where, Guard):
        params = {"c_id": job.id, "c_version": job.version, "c_next": job.version + 1}
        params.update({f"v_{k}": v for k, v in values.items()}, **(bound or {}))
        written = _matched_made_once(session, where.statement(tuple(sorted(values))), params)
    else:
        written = matched(
            session,
            update(Job)
            .where(col(Job.id) == job.id, col(Job.version) == job.version, *where)
            .values(version=job.version + 1, **values)
            .execution_options(synchronize_session=False),
        )
    if written != 1:
        return False
    # The row holds these values now: set them as loaded, not as changes (a plain setattr would make
    # the session write the same values again, unfenced, at the next flush).
    for key, value in {**values, "version": job.version + 1}.items():
        set_committed_value(job, key, value)
    return True


def _fenced(
    session: Session, job_id: int, lease: int, *, where: Sequence[Any] = (), **values: Any
) -> bool:
    """Update a running job only while ``lease`` still owns it."""
    values.setdefault("updated_at", current_time())
    stmt = (
        update(Job)
        .where(
            col(Job.id) == job_id,
            col(Job.lease) == lease,
            col(Job.status) == JobStatus.running,
            *where,
        )
        .values(version=Job.version + 1, **values)
        .execution_options(synchronize_session=False)
    )
    return matched(session, stmt) == 1


def _publish(session: Session, job: Job, at: datetime | None = None) -> None:
    """Have the job published at ``at``: through its outbox row still waiting, if it has one, else a
    new row. Every caller holds the job's compare-and-set in the same transaction, so two
    transitions can never both add a row: a job has at most one unsent outbox row."""
    at = at or db_now(session)
    waiting = matched(
        session,
        update(Outbox)
        .where(col(Outbox.job_id) == job.id, col(Outbox.sent_at).is_(None))
        .values(available_at=at, last_error=None)
        .execution_options(synchronize_session=False),
    )
    if not waiting:
        session.add(Outbox(job_id=job.id, dataset_id=job.dataset_id, available_at=at))


def republish(*, session: Session, job: Job, now: datetime) -> bool:
    """A waiting job whose queue message was lost gets a new one (compare-and-set: two recovery
    loops that both found it stranded publish it once). The caller commits."""
    if not _cas(session, job, where=CLAIMABLE_NOW, now=now):
        return False
    add_event(
        session,
        job,
        "republished",
        message="its queue message was lost; published again",
        data={"status": _val(job.status)},
    )
    _publish(session, job, now)
    return True


@dataclass(frozen=True)
class _Read:
    """A job as stored now, the database's time, and the rows of its document and dataset."""

    job: Job
    now: datetime
    document: Document | None
    dataset: Dataset | None


def _read(session: Session, job_id: int) -> _Read | None:
    """The job, the database's time, its document and its dataset, in one statement (instead of
    ``get_job``, ``db_now`` and a read of each row)."""
    if not 0 < job_id <= MAX_ID:
        return None
    row = session.execute(_READ, {"job_id": job_id}).first()
    return None if row is None else _Read(row[0], as_utc(row[1]), row[2], row[3])


_READ = (
    select(Job, current_time(), Document, Dataset)
    .outerjoin(Document, col(Document.id) == col(Job.document_id))
    .outerjoin(Dataset, col(Dataset.id) == col(Job.dataset_id))
    .where(col(Job.id) == bindparam("job_id"))
    .execution_options(populate_existing=True)
)


def get_job(*, session: Session, job_id: int) -> Job | None:
    if not 0 < job_id <= MAX_ID:  # no row has it (PostgreSQL refuses to compare it with one)
        return None
    return session.get(Job, job_id, populate_existing=True)


def idempotency_key(*, dataset_id: int, sha256: str, pipeline_version: str) -> str:
    """One job per bytes, dataset and pipeline version: an upload of the same file again finds
    it."""
    return f"{dataset_id}:{sha256}:{pipeline_version}"


# --- creation ------------------------------------------------------------------------------------


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
            if _cas(
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
                _publish(session, existing)
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
    _publish(session, job)
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
    return _retire_versions(session, earlier, by=document, actor=actor) is not None


def _contended(external_id: str | None, attempt: int, attempts: int) -> None:
    if attempt >= attempts:
        raise TransientError(
            "upload_contended",
            f"the versions of {external_id!r} kept changing ({attempts} tries)",
            "Upload it again.",
        )


# --- the worker's side ----------------------------------------------------------------------------


def claim(*, session: Session, job_id: int, worker_id: str, lease_seconds: float) -> ClaimResult:
    """pending/retrying -> running, or a recorded no-op saying why not.

    A pause is not looked up first: the compare-and-set itself refuses a job a pause covers, and
    only then is the pause read (one statement less per claim)."""
    found = _read(session, job_id)
    if found is None:
        return ClaimResult(None, False, "no such job")
    job, now = found.job, found.now
    reason = ""
    if job.status in JobStatus.final():
        reason = f"delivery ignored: job is already {job.status.value}"
    elif job.status == JobStatus.running:
        fresh = job.heartbeat_at and job.heartbeat_at > now - timedelta(seconds=lease_seconds)
        reason = (
            f"delivery ignored: already running on {job.worker_id}"
            if fresh
            else "delivery ignored: running with a stale heartbeat; the reaper takes it back"
        )
    elif (
        job.status == JobStatus.retrying
        and job.next_attempt_at
        and job.next_attempt_at > now + timedelta(seconds=1)
    ):
        reason = f"delivery ignored: next attempt is due at {job.next_attempt_at:%H:%M:%S}"
    if reason:
        add_event(session, job, "noop", message=reason, actor=worker_id)
        session.commit()
        return ClaimResult(job, False, reason)
    before = job.status
    ok = _cas(
        session,
        job,
        where=CLAIMABLE_UNPAUSED,
        status=JobStatus.running,
        stage=Stage.parsing,
        done=0,
        total=0,
        attempt=job.attempt + 1,
        lease=job.lease + 1,
        worker_id=worker_id,
        heartbeat_at=now,
        started_at=job.started_at or now,
        next_attempt_at=None,
        embedded_count=0,
        cached_count=0,
        waiting_for=None,
        now=now,
    )
    if not ok:
        session.rollback()
        job = stored(session, Job, job_id, populate_existing=True)
        held = pauses.pause_for(session=session, dataset_id=job.dataset_id)
        if held is not None and job.status in CLAIMABLE:  # a pause covers it: wait for the resume
            return _refuse_paused(session, job, held, worker_id, now)
        reason = f"delivery ignored: claimed concurrently (now {job.status.value})"
        add_event(session, job, "noop", message=reason, actor=worker_id)
        session.commit()
        return ClaimResult(job, False, reason)
    add_event(
        session,
        job,
        "claimed",
        actor=worker_id,
        from_status=before,
        to_status=JobStatus.running,
        message=f"attempt {job.attempt} of {job.max_attempts}",
        data={"lease": job.lease},
    )
    session.commit()
    return ClaimResult(job, True, document=found.document, dataset=found.dataset)


def _refuse_paused(
    session: Session, job: Job, held: Any, worker_id: str, now: datetime, attempts: int = 5
) -> ClaimResult:
    """The job's dataset (or the whole queue) is paused: leave the job waiting with an unsent outbox
    row, which the dispatcher publishes once the pause is lifted."""
    reason = f"delivery ignored: {pauses.describe(held)}; it runs when resumed"
    # The message is consumed either way: an operator's change that lands between our read and this
    # compare-and-set (a priority, "run next") must not leave the job with no message and no row.
    current: Job | None = job
    for _ in range(attempts):
        if _cas(session, job, where=CLAIMABLE_NOW, now=now):
            add_event(
                session, job, "noop", message=reason, actor=worker_id, data={"paused": held.scope}
            )
            _publish(session, job, max(now, job.next_attempt_at or now))
            break
        session.rollback()
        current = get_job(session=session, job_id=job.id)
        if current is None or current.status not in CLAIMABLE:
            break  # cancelled, claimed or gone meanwhile: nothing waits for this message
        job = current
    session.commit()
    return ClaimResult(current, False, reason)


def progress(
    *, session: Session, job_id: int, lease: int, stage: Stage, done: int, total: int, **extra: Any
) -> bool:
    """Write stage counts and the heartbeat, and the counts as a ``progress`` event of the log (in
    the same transaction: one small insert per write, which the runner makes at most twice a second,
    never per chunk; none for the last write of indexing, which the success follows at once); return
    cancel_requested. LeaseLost if not ours (and no event). The fenced update returns what the
    event needs (no second read of the row just written)."""
    params = {"w_id": job_id, "w_lease": lease, "v_stage": stage, "v_done": done, "v_total": total}
    params.update({f"v_{k}": v for k, v in extra.items()})
    row = session.execute(_progress_statement(tuple(sorted(extra))), params).first()
    if row is None:
        session.rollback()
        raise LeaseLost(f"job {job_id} is no longer owned by lease {lease}")
    if not (stage == Stage.indexing and done >= total):  # the success event says that one
        session.add(
            JobEvent(
                job_id=job_id,
                kind="progress",
                actor=row.worker_id or "system",
                stage=_val(stage),
                attempt=row.attempt,
                message=describe_progress(stage, done, total),
                data={"done": done, "total": total},
            )
        )
    session.commit()
    return bool(row.cancel_requested)


@lru_cache(maxsize=16)
def _progress_statement(extra: tuple[str, ...]) -> Any:
    """The fenced write of stage counts and heartbeat (and of the columns ``extra`` names, bound as
    ``v_*``), returning what the event needs: made once per set of extra columns."""
    return (
        update(JOB)
        .where(
            JOB.c.id == bindparam("w_id"),
            JOB.c.lease == bindparam("w_lease"),
            JOB.c.status == JobStatus.running,
        )
        .values(
            {
                **{k: bindparam(f"v_{k}") for k in extra},
                "version": JOB.c.version + 1,
                "updated_at": current_time(),
                "stage": bindparam("v_stage"),
                "done": bindparam("v_done"),
                "total": bindparam("v_total"),
                "heartbeat_at": current_time(),
            }
        )
        .returning(JOB.c.cancel_requested, JOB.c.attempt, JOB.c.worker_id)
    )


_OWNS = select(JOB.c.id).where(
    JOB.c.id == bindparam("job_id"),
    JOB.c.lease == bindparam("lease"),
    JOB.c.status == JobStatus.running,
)


def owns(*, session: Session, job_id: int, lease: int) -> bool:
    """Does the attempt of ``lease`` still own the running job?"""
    found = session.execute(_OWNS, {"job_id": job_id, "lease": lease}).first()
    session.rollback()
    return found is not None


def cancel_requested(*, session: Session, job_id: int) -> bool:
    return bool(
        session.execute(select(Job.cancel_requested).where(Job.id == job_id)).scalar_one_or_none()
    )


def heartbeat(*, session: Session, job_id: int, lease: int) -> bool:
    ok = _fenced(session, job_id, lease, heartbeat_at=current_time())
    session.commit()
    return ok


SUPERSEDABLE = (JobStatus.succeeded, JobStatus.pending, JobStatus.running, JobStatus.retrying)


def succeed(
    *,
    session: Session,
    job_id: int,
    lease: int,
    chunk_count: int,
    page_count: int,
    worker_id: str,
    embedded: int,
    cached: int,
    warnings: Sequence[str] = (),
    stages: dict[str, float] | None = None,
    attempts: int = 5,
    read: Callable[[Document], None] | None = None,
) -> list[int]:
    """running -> succeeded; makes this job the document's searchable one. Each warning (a page
    skipped, a file that needed repair) is a ``warning`` event of the job; ``stages`` (seconds per
    stage) go into the success event.

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
        superseded = _succeed_once(
            session,
            job_id,
            lease,
            chunk_count=chunk_count,
            page_count=page_count,
            worker_id=worker_id,
            embedded=embedded,
            cached=cached,
            warnings=warnings,
            stages=stages,
            read=read,
        )
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
    *,
    chunk_count: int,
    page_count: int,
    worker_id: str,
    embedded: int,
    cached: int,
    warnings: Sequence[str],
    stages: dict[str, float] | None,
    read: Callable[[Document], None] | None = None,
) -> list[int] | None:
    """One try of ``succeed``: the ids it superseded, or None when a compare-and-set was lost and
    nothing was written (read again and try again)."""
    found = _read(session, job_id)
    if found is None or found.job.lease != lease or found.job.status != JobStatus.running:
        session.rollback()
        raise LeaseLost(f"job {job_id} is no longer owned by lease {lease}")
    job, now, document = found.job, found.now, found.document
    if job.cancel_requested:
        session.rollback()
        raise JobCancelled()
    if document is None:
        raise LookupError(f"no Document {job.document_id!r}")
    serving = document.active_job_id
    hidden = document.deleted_at is not None  # a source's removal stays: see _make_active
    keep_hidden = hidden and source_records.is_tombstoned(session, document.id)
    others = session.scalars(_OTHERS, {"document_id": job.document_id, "job_id": job_id}).all()
    faults.hit("before_supersede", job_id=job_id)
    if not _mark_succeeded(
        session,
        job,
        lease,
        now=now,
        chunk_count=chunk_count,
        page_count=page_count,
        embedded=embedded,
        cached=cached,
    ):
        session.rollback()
        return None  # a beat of our own heartbeat, a cancel, or a reaper: read again and see
    _record_success(
        session, job, worker_id, chunk_count, page_count, embedded, cached, warnings, stages
    )
    superseded, lost = _supersede(session, job, others, now=now)
    older = replacements.others_to_retire(session, document)
    retired = _retire_versions(session, older, by=document, actor=worker_id, now=now)
    switched = _make_active(
        session, document, job, serving=serving, hidden=hidden, keep_hidden=keep_hidden
    )
    if lost or retired is None or not switched:
        session.rollback()
        return None
    session.commit()
    if read is not None:
        read(document)
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


def _record_success(
    session: Session,
    job: Job,
    worker_id: str,
    chunk_count: int,
    page_count: int,
    embedded: int,
    cached: int,
    warnings: Sequence[str],
    stages: dict[str, float] | None,
) -> None:
    """The success event (with its webhook) and one ``warning`` event per warning."""
    logged = add_event(
        session,
        job,
        "succeeded",
        actor=worker_id,
        from_status=JobStatus.running,
        to_status=JobStatus.succeeded,
        message=f"{chunk_count} chunks from {page_count} pages ({embedded} embedded, "
        f"{cached} from cache)",
        data={
            "chunks": chunk_count,
            "pages": page_count,
            "embedded": embedded,
            "cached": cached,
            "warnings": len(warnings),
            "stages": stages or {},
        },
    )
    webhook_records.record(session, job, "job.succeeded", logged=logged)
    for text in warnings:
        add_event(session, job, "warning", actor=worker_id, message=text)


def _retire_versions(
    session: Session,
    olds: Sequence[Document],
    *,
    by: Document,
    actor: str,
    now: datetime | None = None,
) -> list[int] | None:
    """Other versions of ``by``'s external id -> deleted, replaced by it, with all their jobs, in
    the caller's transaction: the ids of the jobs whose chunks are to go, or None when a
    compare-and-set was lost (the caller rolls back and reads again)."""
    job_ids: list[int] = []
    for old in olds:
        now = now or db_now(session)
        results = delete_jobs_of(
            session,
            old,
            actor=actor,
            reason=f"replaced by version {by.doc_version} (document {by.id})",
            now=now,
            data={"replaced_by": by.id},
        )
        if results is None or not replacements.retire(session, old, by=by, now=now):
            return None
        job_ids += [r.job_id for r in results]
    return job_ids


def _mark_succeeded(
    session: Session,
    job: Job,
    lease: int,
    *,
    now: datetime,
    chunk_count: int,
    page_count: int,
    embedded: int,
    cached: int,
) -> bool:
    """running -> succeeded, fenced on the lease and on no cancel having been requested."""
    return _cas(
        session,
        job,
        where=RUNNING_UNCANCELLED,
        bound={"w_lease": lease},
        status=JobStatus.succeeded,
        stage=Stage.done,
        done=chunk_count,
        total=chunk_count,
        chunk_count=chunk_count,
        page_count=page_count,
        finished_at=now,
        heartbeat_at=now,
        error_kind=None,
        error_code=None,
        error_message=None,
        fix_hint=None,
        error_detail=None,
        embedded_count=embedded,
        cached_count=cached,
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
        if not _cas(
            session,
            old,
            where=[Job.status == before],
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
) -> bool:
    """The document's searchable job becomes ``job``, if it is still ``serving`` and still as
    ``hidden`` as when read (compare-and-set). A deleted document uploaded again comes back; one
    a source's sync tombstoned (``keep_hidden``) stays out of search: the removal wins, and the
    job's chunks wait for ``sluice sources undo`` like its other kept chunks."""
    stmt = _make_active_statement(serving is None, hidden, keep_hidden)
    params = {"w_id": document.id, "w_serving": serving, "v_job": job.id}
    return _matched_made_once(session, stmt, params) == 1


@lru_cache(maxsize=8)
def _make_active_statement(unserved: bool, hidden: bool, keep_hidden: bool) -> Any:
    """``_make_active``'s compare-and-set on the document table, made once per shape."""
    doc = SQLModel.metadata.tables["document"]
    serving = doc.c.active_job_id
    where = [
        doc.c.id == bindparam("w_id"),
        serving.is_(None) if unserved else serving == bindparam("w_serving"),
    ]
    if not hidden or keep_hidden:  # a removal landing since the read: read again, decide again
        where.append(doc.c.deleted_at.is_not(None) if hidden else doc.c.deleted_at.is_(None))
    values: dict[str, Any] = {"active_job_id": bindparam("v_job")}
    if not keep_hidden:
        values["deleted_at"] = None
    return update(doc).where(*where).values(values)


def _while_ours(
    session: Session,
    job_id: int,
    lease: int,
    once: Callable[[], Job | None],
    *,
    stale_before: datetime | None = None,
    attempts: int = 5,
) -> Job | None:
    """Run a compare-and-set transition of a running attempt until it lands, or the job is no
    longer this lease's (or, for the reaper, no longer stale). Losing only to a beat of the job's
    own heartbeat, which bumps the version several times a second, is no reason to give up."""
    for _ in range(attempts):
        done = once()
        if done is not None:
            return done
        job = get_job(session=session, job_id=job_id)
        session.rollback()
        if job is None or job.lease != lease or job.status != JobStatus.running:
            return None
        if stale_before is not None and (
            job.heartbeat_at is None or job.heartbeat_at >= stale_before
        ):
            return None
    return None


def fail(
    *,
    session: Session,
    job_id: int,
    lease: int,
    kind: ErrorKind,
    code: str,
    message: str,
    hint: str,
    detail: str,
    worker_id: str,
    base_delay: float,
    max_delay: float,
    rng: random.Random | None = None,
    stale_before: datetime | None = None,
    waiting_for: str | None = None,
    poll_seconds: float = 15.0,
    max_wait_seconds: float = 6 * 3600.0,
    page_count: int | None = None,
) -> Job | None:
    """End a failed attempt: retrying with backoff (transient, budget left) or failed (dead letter).
    ``page_count``, when the attempt got as far as counting pages, is kept on the job.

    ``stale_before`` (the reaper's): only while the heartbeat is still older than that.
    ``waiting_for`` (a dependency is down, not the job's failure): the job waits, retrying every
    ``poll_seconds`` or so with the attempt given back, until the wait that began with the first
    such round exceeds ``max_wait_seconds``; then it is a dead letter that says so.
    """
    return _while_ours(
        session,
        job_id,
        lease,
        lambda: _fail_once(
            session=session,
            job_id=job_id,
            lease=lease,
            kind=kind,
            code=code,
            message=message,
            hint=hint,
            detail=detail,
            worker_id=worker_id,
            base_delay=base_delay,
            max_delay=max_delay,
            rng=rng,
            stale_before=stale_before,
            waiting_for=waiting_for,
            poll_seconds=poll_seconds,
            max_wait_seconds=max_wait_seconds,
            page_count=page_count,
        ),
        stale_before=stale_before,
    )


def _fail_once(
    *,
    session: Session,
    job_id: int,
    lease: int,
    kind: ErrorKind,
    code: str,
    message: str,
    hint: str,
    detail: str,
    worker_id: str,
    base_delay: float,
    max_delay: float,
    rng: random.Random | None,
    stale_before: datetime | None,
    waiting_for: str | None,
    poll_seconds: float,
    max_wait_seconds: float,
    page_count: int | None = None,
) -> Job | None:
    job = get_job(session=session, job_id=job_id)
    if job is None or job.lease != lease or job.status != JobStatus.running:
        return None
    if stale_before is not None and (job.heartbeat_at is None or job.heartbeat_at >= stale_before):
        session.rollback()
        return None
    errors = _error_fields(kind, code, message, hint, detail, page_count)
    if job.cancel_requested:
        return _cancelled(session, job, actor=worker_id, **errors)
    faults.hit("before_fail_write", job_id=job_id)
    now = db_now(session)
    data: dict[str, Any] = {"code": code, "kind": kind.value}
    gave_up_waiting = False
    if waiting_for is not None:
        since = job.waiting_since or now
        waited = (now - since).total_seconds()
        if waited <= max_wait_seconds:
            return _wait(
                session,
                job,
                now=now,
                since=since,
                waiting_for=waiting_for,
                worker_id=worker_id,
                poll_seconds=poll_seconds,
                rng=rng,
                data=data,
                **errors,
            )
        kind = _outage_too_long(errors, waited, waiting_for, max_wait_seconds, message)
        gave_up_waiting = True
    if kind == ErrorKind.transient and job.attempt < job.max_attempts and not gave_up_waiting:
        ceiling, delay = backoff_delay(job.attempt, base=base_delay, cap=max_delay, rng=rng)
        landed = _retry_later(
            session,
            job,
            lease,
            due=now + timedelta(seconds=delay),
            delay=delay,
            ceiling=ceiling,
            message=message,
            worker_id=worker_id,
            data=data,
            errors=errors,
        )
    else:
        if kind == ErrorKind.transient and not gave_up_waiting:
            errors["error_message"] = f"gave up after {job.attempt} attempts: {message}"
        landed = _dead_letter(
            session, job, lease, now=now, worker_id=worker_id, data=data, errors=errors
        )
    if not landed:
        session.rollback()
        return None
    session.commit()
    return job


def _error_fields(
    kind: ErrorKind, code: str, message: str, hint: str, detail: str, page_count: int | None
) -> dict[str, Any]:
    """The job's error columns for a failed attempt (and its page count, when it got that far)."""
    errors: dict[str, Any] = dict(
        error_kind=kind,
        error_code=code,
        error_message=message,
        fix_hint=hint,
        error_detail=detail[-8000:] if detail else None,
    )
    if page_count is not None:
        errors["page_count"] = page_count
    return errors


def _outage_too_long(
    errors: dict[str, Any], waited: float, waiting_for: str, max_wait_seconds: float, message: str
) -> ErrorKind:
    """The wait for a dependency ran out: the error becomes a transient ``outage_too_long`` that
    says how long it waited and for what (a dead letter, not a retry)."""
    kind = errors["error_kind"] = ErrorKind.transient
    errors["error_code"] = "outage_too_long"
    errors["error_message"] = (
        f"waited {waited / 3600:.1f} h for {waiting_for}, longer than "
        f"SLUICE_MAX_OUTAGE_SECONDS ({max_wait_seconds:.0f} s): {message}"
    )
    errors["fix_hint"] = (
        f"Bring {waiting_for} back, then retry the job (Retry in the console, or `sluice retry`)."
    )
    return kind


def _retry_later(
    session: Session,
    job: Job,
    lease: int,
    *,
    due: datetime,
    delay: float,
    ceiling: float,
    message: str,
    worker_id: str,
    data: dict[str, Any],
    errors: dict[str, Any],
) -> bool:
    """running -> retrying, due after the backoff; False when the compare-and-set was lost."""
    if not _cas(
        session,
        job,
        where=[Job.lease == lease],
        status=JobStatus.retrying,
        next_attempt_at=due,
        worker_id=None,
        waiting_for=None,
        waiting_since=None,
        **errors,
    ):
        return False
    data.update(delay=round(delay, 3), ceiling=ceiling, due=due.isoformat())
    add_event(
        session,
        job,
        "attempt_failed",
        actor=worker_id,
        from_status=JobStatus.running,
        to_status=JobStatus.retrying,
        data=data,
        message=f"{message}; retry {job.attempt + 1}/{job.max_attempts} in {delay:.1f}s",
    )
    _publish(session, job, due)
    return True


def _dead_letter(
    session: Session,
    job: Job,
    lease: int,
    *,
    now: datetime,
    worker_id: str,
    data: dict[str, Any],
    errors: dict[str, Any],
) -> bool:
    """running -> failed (a dead letter); False when the compare-and-set was lost."""
    if not _cas(
        session,
        job,
        where=[Job.lease == lease],
        status=JobStatus.failed,
        finished_at=now,
        worker_id=None,
        next_attempt_at=None,
        waiting_for=None,
        **errors,
    ):
        return False
    logged = add_event(
        session,
        job,
        "failed",
        actor=worker_id,
        from_status=JobStatus.running,
        to_status=JobStatus.failed,
        data=data,
        message=errors["error_message"],
    )
    webhook_records.record(session, job, "job.failed", logged=logged)
    return True


def _wait(
    session: Session,
    job: Job,
    *,
    now: datetime,
    since: datetime,
    waiting_for: str,
    worker_id: str,
    poll_seconds: float,
    rng: random.Random | None,
    data: dict[str, Any],
    **errors: Any,
) -> Job | None:
    """running -> retrying without spending the attempt: something the job needs is missing."""
    delay = (rng or random).uniform(poll_seconds / 2, poll_seconds)
    due = now + timedelta(seconds=delay)
    message = f"waiting for {waiting_for}: {errors['error_message']}"
    errors["error_message"] = message
    if not _cas(
        session,
        job,
        where=[Job.lease == job.lease],
        status=JobStatus.retrying,
        attempt=job.attempt - 1,
        next_attempt_at=due,
        worker_id=None,
        waiting_for=waiting_for,
        waiting_since=since,
        now=now,
        **errors,
    ):
        session.rollback()
        return None
    data.update(
        delay=round(delay, 3),
        due=due.isoformat(),
        waiting_for=waiting_for,
        waiting_since=since.isoformat(),
    )
    add_event(
        session,
        job,
        "waiting",
        actor=worker_id,
        from_status=JobStatus.running,
        to_status=JobStatus.retrying,
        data=data,
        message=f"{message}; attempt not counted; looking again in {delay:.1f}s",
    )
    _publish(session, job, due)
    session.commit()
    return job


def _cancelled(session: Session, job: Job, *, actor: str, **extra: Any) -> Job | None:
    where_text = describe_progress(job.stage, job.done, job.total)
    before = job.status
    msg = f"cancelled at {where_text}"
    now = db_now(session)
    if not _cas(
        session,
        job,
        status=JobStatus.cancelled,
        finished_at=now,
        cancel_requested=False,
        now=now,
        worker_id=None,
        next_attempt_at=None,
        **{
            "error_message": msg,
            "error_code": "cancelled",
            "error_kind": None,
            "fix_hint": None,
            "waiting_for": None,
            **extra,
        },
    ):
        session.rollback()
        return None
    logged = add_event(
        session,
        job,
        "cancelled",
        actor=actor,
        from_status=before,
        to_status=JobStatus.cancelled,
        message=msg,
        data={"stage": _val(job.stage), "done": job.done, "total": job.total},
    )
    webhook_records.record(session, job, "job.cancelled", logged=logged)
    session.commit()
    return job


def acknowledge_cancel(*, session: Session, job_id: int, lease: int, worker_id: str) -> Job | None:
    """The worker stopped a running job after cancel was requested (vectors already removed)."""

    def once() -> Job | None:
        job = get_job(session=session, job_id=job_id)
        if job is None or job.lease != lease or job.status != JobStatus.running:
            return None
        return _cancelled(session, job, actor=worker_id)

    return _while_ours(session, job_id, lease, once)


def hand_back(
    *, session: Session, job_id: int, lease: int, worker_id: str, reason: str
) -> Job | None:
    """running -> pending, the attempt not counted: the worker is stopping in order and gives the
    job back instead of finishing it (what the attempt wrote stays: the next one skips those ids).
    None when the job is no longer this lease's, or a cancel is waiting (the reaper carries it
    out, removing the attempt's chunks)."""

    def once() -> Job | None:
        job = get_job(session=session, job_id=job_id)
        if job is None or job.lease != lease or job.status != JobStatus.running:
            return None
        if job.cancel_requested:
            return None
        now = db_now(session)
        where = describe_progress(job.stage, job.done, job.total)
        if not _cas(
            session,
            job,
            where=[Job.lease == lease, Job.status == JobStatus.running],
            status=JobStatus.pending,
            stage=Stage.queued,
            done=0,
            total=0,
            attempt=max(0, job.attempt - 1),
            worker_id=None,
            next_attempt_at=None,
            now=now,
        ):
            session.rollback()
            return None
        add_event(
            session,
            job,
            "handed_back",
            actor=worker_id,
            from_status=JobStatus.running,
            to_status=JobStatus.pending,
            message=f"{reason}; handed back at {where}, attempt not counted",
            data={"lease": lease},
        )
        _publish(session, job, now)
        session.commit()
        return job

    job = get_job(session=session, job_id=job_id)
    session.rollback()
    if job is not None and job.cancel_requested:
        return None
    return _while_ours(session, job_id, lease, once)


def running_on(*, session: Session, worker_id: str) -> list[tuple[int, int]]:
    """(job id, lease) of every job running on this worker."""
    rows = session.exec(
        select(Job.id, Job.lease).where(Job.status == JobStatus.running, Job.worker_id == worker_id)
    ).all()
    session.rollback()
    return [(int(job_id), int(lease)) for job_id, lease in rows]


@dataclass(frozen=True)
class ReaperTick:
    wait: float  # seconds before the reapers may take running jobs back (0: now)
    silence: bool  # this tick found a silence of every reaper (and started a new grace)


def reaper_wait(*, session: Session, silence_seconds: float, grace_seconds: float) -> float | None:
    """``reaper_tick``'s wait alone."""
    tick = reaper_tick(
        session=session, silence_seconds=silence_seconds, grace_seconds=grace_seconds
    )
    return None if tick is None else tick.wait


def reaper_tick(
    *, session: Session, silence_seconds: float, grace_seconds: float
) -> ReaperTick | None:
    """One reaper's tick, recorded for the whole fleet; returns how many seconds this reaper waits
    before it takes running jobs back (0: now), or None when another reaper holds the record at
    this moment (it reaps this round; this one skips it).

    Every worker's recovery loop ticks here every few seconds. A silence longer than
    ``silence_seconds`` since the last tick of any of them means that no reaper found the database
    answering meanwhile: it was down (and no worker could write a heartbeat either), or no worker
    ran at all. Either way a running job's heartbeat may be stale for reasons that are not its own,
    so no reaper takes one back within ``grace_seconds`` of the end of the silence: enough for the
    heartbeats of live workers to land again. Kept in the database, it holds for reapers that never
    saw the outage themselves (their loop slept through it, or they started after it). A reaper
    that finds a silence waits out the grace and then reaps in the same round, so one that always
    ticks after a silence (``sluice recover`` with no worker up) still takes dead jobs back.
    """
    now = db_now(session)
    # SKIP LOCKED: a reaper frozen between its read and its commit must not stop every other one.
    row = session.exec(select(Instance).with_for_update(skip_locked=True)).first()
    if row is None:
        session.rollback()
        return None
    silence = (
        row.reaper_tick_at is not None
        and (now - row.reaper_tick_at).total_seconds() > silence_seconds
    )
    if silence:
        row.reap_after = now + timedelta(seconds=grace_seconds)
    row.reaper_tick_at = now
    wait = _held_for(row, now)
    session.add(row)
    session.commit()
    return ReaperTick(wait, silence)


@dataclass(frozen=True)
class ReaperState:
    """What the fleet's reapers last did, on the database's clock (see ``reaper_wait``)."""

    last_tick_seconds_ago: float | None  # None: no reaper has ticked yet (no worker ever ran)
    held_for_seconds: float  # > 0: reaping waits this much longer after a silence of every reaper


def reaper_state(*, session: Session) -> ReaperState:
    now = db_now(session)
    row = session.exec(select(Instance)).first()
    if row is None or row.reaper_tick_at is None:
        return ReaperState(None, 0.0)
    return ReaperState(max(0.0, (now - row.reaper_tick_at).total_seconds()), _held_for(row, now))


def _held_for(row: Instance, now: datetime) -> float:
    """Seconds until the reapers may take jobs back (0: now)."""
    return max(0.0, (row.reap_after - now).total_seconds()) if row.reap_after is not None else 0.0


def reap(
    *,
    session: Session,
    lease_seconds: float,
    base_delay: float,
    max_delay: float,
    now: datetime | None = None,
) -> list[int]:
    """Take back running jobs whose heartbeat is older than the lease; returns their ids.

    Only running jobs have heartbeats; a job waiting in the queue is pending or retrying and is
    never touched here. Each job is taken back by compare-and-set on what the reaper read: the same
    lease, still running, heartbeat still stale. A beat that lands after the read, or a claim by a
    healthy worker meanwhile, wins over the reaper.
    """
    now = now or db_now(session)
    cutoff = now - timedelta(seconds=lease_seconds)
    stale = session.execute(
        select(  # type: ignore[call-overload]  # sqlmodel types select() up to 4 columns
            Job.id, Job.lease, Job.heartbeat_at, Job.worker_id, Job.stage, Job.done, Job.total
        )
        .where(Job.status == JobStatus.running, col(Job.heartbeat_at) < cutoff)
        .order_by(col(Job.id))
    ).all()
    session.rollback()  # plain values read; nothing held open while each job is handled
    taken = []
    for job_id, lease, beat, worker, stage, done, total in stale:
        faults.hit("reap_selected", job_id=job_id)
        silent = (now - beat).total_seconds()
        result = fail(
            session=session,
            job_id=job_id,
            lease=lease,
            kind=ErrorKind.transient,
            code="worker_lost",
            message=f"worker {worker} stopped answering during "
            f"{describe_progress(stage, done, total)} (no heartbeat for {silent:.0f}s)",
            hint="Sluice retries this by itself. If workers keep dying, check their logs and "
            "memory.",
            detail="",
            worker_id="reaper",
            base_delay=base_delay,
            max_delay=max_delay,
            stale_before=cutoff,
        )
        if result is not None:
            taken.append(job_id)
    return taken


# --- the operator's side --------------------------------------------------------------------------


def _load_many(session: Session, job_ids: Iterable[int]) -> list[tuple[int, Job | None]]:
    return [(jid, get_job(session=session, job_id=jid)) for jid in job_ids]


def request_cancel(*, session: Session, job_ids: Iterable[int], actor: str) -> list[ActionResult]:
    results = []
    for jid, job in _load_many(session, job_ids):
        if job is None:
            results.append(ActionResult(jid, False, f"job {jid} does not exist"))
        elif job.status in (JobStatus.pending, JobStatus.retrying):
            done = _cancelled(session, job, actor=actor)
            results.append(
                ActionResult(
                    jid,
                    done is not None,
                    f"job {jid} cancelled before it ran"
                    if done
                    else f"job {jid} changed meanwhile; try again",
                )
            )
        elif job.status == JobStatus.running:
            if job.cancel_requested:
                results.append(ActionResult(jid, True, f"job {jid}: cancel already requested"))
                continue
            # Not on the version: the job's own heartbeat bumps it several times a second.
            ok = (
                matched(
                    session,
                    update(Job)
                    .where(col(Job.id) == jid, col(Job.status) == JobStatus.running)
                    .values(
                        cancel_requested=True, version=Job.version + 1, updated_at=current_time()
                    )
                    .execution_options(synchronize_session=False),
                )
                == 1
            )
            if ok:
                add_event(
                    session,
                    job,
                    "cancel_requested",
                    actor=actor,
                    message="cancel requested at "
                    f"{describe_progress(job.stage, job.done, job.total)}",
                )
            session.commit()
            results.append(
                ActionResult(
                    jid,
                    ok,
                    f"job {jid} is running; it stops at its next batch and its vectors are removed"
                    if ok
                    else f"job {jid} changed meanwhile; try again",
                )
            )
        else:
            results.append(
                ActionResult(
                    jid,
                    False,
                    f"job {jid} is {job.status.value}; only pending, "
                    "retrying or running jobs can be cancelled",
                )
            )
    return results


def retry(
    *, session: Session, job_ids: Iterable[int], actor: str, reason: str = "manual retry"
) -> list[ActionResult]:
    """failed/cancelled -> pending with a fresh attempt budget, published again."""
    results = []
    for jid, job in _load_many(session, job_ids):
        if job is None:
            results.append(ActionResult(jid, False, f"job {jid} does not exist"))
            continue
        if job.status == JobStatus.succeeded:
            results.append(
                ActionResult(
                    jid,
                    False,
                    f"job {jid} has already succeeded; retry refused. "
                    "Use reindex to rebuild its chunks on purpose.",
                )
            )
            continue
        if job.status not in RETRYABLE:
            results.append(
                ActionResult(
                    jid,
                    False,
                    f"job {jid} is {job.status.value}; only failed or "
                    "cancelled jobs can be retried",
                )
            )
            continue
        before = job.status
        ok = _cas(
            session,
            job,
            where=[col(Job.status).in_(RETRYABLE)],
            status=JobStatus.pending,
            stage=Stage.queued,
            done=0,
            total=0,
            attempt=0,
            next_attempt_at=None,
            finished_at=None,
            dismissed=False,
            cancel_requested=False,
            error_kind=None,
            error_code=None,
            error_message=None,
            fix_hint=None,
            error_detail=None,
            waiting_for=None,
            waiting_since=None,
        )
        if ok:
            add_event(
                session,
                job,
                "retried",
                actor=actor,
                from_status=before,
                to_status=JobStatus.pending,
                message=reason,
            )
            _publish(session, job)
        session.commit()
        results.append(
            ActionResult(
                jid,
                ok,
                f"job {jid} queued again ({reason})"
                if ok
                else f"job {jid} changed meanwhile; try again",
            )
        )
    return results


def set_priority(
    *,
    session: Session,
    job_ids: Iterable[int],
    actor: str,
    priority: int | None,
    verb: str = "priority set",
) -> list[ActionResult]:
    """Give waiting jobs a priority (higher is published first; None: their dataset's again)."""
    results = []
    for jid, job in _load_many(session, job_ids):
        if job is None or job.status not in CLAIMABLE:
            state = "does not exist" if job is None else f"is {job.status.value}"
            results.append(
                ActionResult(
                    jid,
                    False,
                    f"job {jid} {state}; only waiting jobs (pending, "
                    "retrying) can be moved in the queue",
                )
            )
            continue
        before = job.priority
        ok = _cas(session, job, where=CLAIMABLE_NOW, priority=priority)
        if ok:
            add_event(
                session,
                job,
                "priority",
                actor=actor,
                message=f"{verb}: {priority}",
                data={"from": before, "to": priority},
            )
        session.commit()
        results.append(
            ActionResult(
                jid,
                ok,
                f"job {jid}: {verb} ({priority})"
                if ok
                else f"job {jid} changed meanwhile; try again",
            )
        )
    return results


def run_next(*, session: Session, job_ids: Iterable[int], actor: str) -> list[ActionResult]:
    """Move waiting jobs to the front: a priority above every other waiting job's."""
    top = (
        session.execute(
            select(func.max(func.coalesce(Job.priority, models.Dataset.priority, 0)))
            .join(models.Dataset, col(models.Dataset.id) == Job.dataset_id)
            .where(col(Job.status).in_(CLAIMABLE))
        ).scalar()
        or 0
    )
    return set_priority(
        session=session, job_ids=job_ids, actor=actor, priority=top + 1, verb="run next"
    )


def set_dataset_priority(*, session: Session, dataset_id: int, priority: int | None) -> bool:
    """The priority of a dataset's jobs that have none of their own (None: the default, 0)."""
    done = matched(
        session,
        update(models.Dataset)
        .where(col(models.Dataset.id) == dataset_id)
        .values(priority=priority),
    )
    session.commit()
    return bool(done)


def _from_status(
    session: Session,
    job_ids: Iterable[int],
    *,
    source: JobStatus,
    refusal: str,
    event: str,
    actor: str,
    reason: str,
    said: Callable[[Job], str],
    publish: bool,
    **change: Any,
) -> list[ActionResult]:
    """One operator transition out of ``source`` for each job, by compare-and-set; each a result
    line."""
    results = []
    for jid, job in _load_many(session, job_ids):
        if job is None or job.status != source:
            state = "does not exist" if job is None else f"is {job.status.value}"
            results.append(ActionResult(jid, False, f"job {jid} {state}; {refusal}"))
            continue
        ok = _cas(session, job, where=[Job.status == source], **change)
        if ok:
            to_status = change.get("status")
            add_event(
                session,
                job,
                event,
                actor=actor,
                from_status=source if to_status else None,
                to_status=to_status,
                message=reason,
            )
            if publish:
                _publish(session, job)
        session.commit()
        results.append(ActionResult(jid, ok, said(job) if ok else f"job {jid} changed meanwhile"))
    return results


def reindex(
    *, session: Session, job_ids: Iterable[int], actor: str, reason: str = "reindex"
) -> list[ActionResult]:
    """succeeded -> pending: rebuild the same chunks on purpose; search keeps serving the old
    ones."""
    return _from_status(
        session,
        job_ids,
        source=JobStatus.succeeded,
        event="reindex_requested",
        actor=actor,
        reason=reason,
        refusal="only succeeded jobs can be reindexed",
        publish=True,
        said=lambda job: f"job {job.id} queued for reindex",
        **{
            "status": JobStatus.pending,
            "stage": Stage.queued,
            "done": 0,
            "total": 0,
            "attempt": 0,
            "finished_at": None,
        },
    )


def dismiss(*, session: Session, job_ids: Iterable[int], actor: str) -> list[ActionResult]:
    """Hide a dead letter from the dead-letter list (it stays failed, with its history)."""
    return _from_status(
        session,
        job_ids,
        source=JobStatus.failed,
        event="dismissed",
        actor=actor,
        reason="dismissed from dead letters",
        refusal="only a dead letter can be dismissed",
        publish=False,
        said=lambda job: f"job {job.id} dismissed",
        dismissed=True,
    )


# --- integrity: pipeline versions and delete ------------------------------------------------------


def revive(
    *,
    session: Session,
    job_ids: Iterable[int],
    actor: str,
    reason: str = "pipeline version in force again",
) -> list[ActionResult]:
    """superseded -> pending: the settings went back to this job's pipeline version, so build it
    again (its chunks were removed when it was superseded). Search keeps serving the document's
    active job until this one succeeds and takes over."""
    return _from_status(
        session,
        job_ids,
        source=JobStatus.superseded,
        event="revived",
        actor=actor,
        reason=reason,
        refusal="only superseded jobs can be revived",
        publish=True,
        said=lambda job: f"job {job.id} queued to build pipeline {job.pipeline_version} again",
        **{
            "status": JobStatus.pending,
            "stage": Stage.queued,
            "done": 0,
            "total": 0,
            "attempt": 0,
            "finished_at": None,
            "next_attempt_at": None,
            "cancel_requested": False,
        },
    )


def mark_deleted(
    *,
    session: Session,
    document_id: int,
    actor: str,
    reason: str = "document deleted",
    attempts: int = 5,
) -> list[ActionResult]:
    """Every job of a document -> deleted, and the document -> deleted_at, in one transaction.

    Jobs and their events stay (the audit trail); search stops answering the document at once. A
    running job loses its fence: its worker's next write fails and it stops. The caller removes the
    vectors and the blob afterwards. A compare-and-set that loses to a worker's write is tried
    again.
    """
    for _ in range(attempts):
        document = session.get(Document, document_id, populate_existing=True)
        if document is None:
            return [ActionResult(0, False, f"document {document_id} does not exist")]
        now = db_now(session)
        results = delete_jobs_of(session, document, actor=actor, reason=reason, now=now)
        if results is None:
            session.rollback()
            continue
        document.deleted_at = document.deleted_at or now
        document.active_job_id = None
        session.add(document)
        session.commit()
        return results
    return [ActionResult(0, False, f"document {document_id}: its jobs kept changing; try again")]


def delete_jobs_of(
    session: Session,
    document: Document,
    *,
    actor: str,
    reason: str,
    now: datetime,
    data: dict[str, Any] | None = None,
) -> list[ActionResult] | None:
    """Every job of ``document`` -> deleted, by compare-and-set, in the caller's transaction; None
    when one compare-and-set lost to a worker's write (the caller rolls back and reads again)."""
    rows = session.exec(
        select(Job)
        .where(Job.document_id == document.id)
        .order_by(col(Job.id))
        .execution_options(populate_existing=True)
    ).all()
    results = []
    for job in rows:
        if job.status == JobStatus.deleted:
            results.append(ActionResult(job.id, True, f"job {job.id} was already deleted"))
            continue
        before = job.status
        if not _cas(
            session,
            job,
            status=JobStatus.deleted,
            cancel_requested=False,
            worker_id=None,
            next_attempt_at=None,
            waiting_for=None,
            waiting_since=None,
            finished_at=job.finished_at or now,
            now=now,
        ):
            return None
        add_event(
            session,
            job,
            "deleted",
            actor=actor,
            from_status=before,
            to_status=JobStatus.deleted,
            message=reason,
            data={
                "document_id": document.id,
                "was_active": document.active_job_id == job.id,
                **(data or {}),
            },
        )
        results.append(ActionResult(job.id, True, f"job {job.id} deleted (was {before.value})"))
    return results


# --- versions -------------------------------------------------------------------------------------

ACTION_FOR_STATUS = {
    None: "create",
    JobStatus.failed: "retry",
    JobStatus.cancelled: "retry",
    JobStatus.superseded: "revive",
    JobStatus.succeeded: "reindex",  # built once, but an older job took search back; build it again
    JobStatus.deleted: "create",  # create_job brings a deleted job of a live document back
    JobStatus.pending: "underway",
    JobStatus.running: "underway",
    JobStatus.retrying: "underway",
}


def ensure_version_job(
    *,
    session: Session,
    document: Document,
    pipeline_version: str,
    max_attempts: int,
    actor: str,
    reason: str,
) -> tuple[ActionResult, bool]:
    """Make sure a job of ``pipeline_version`` is queued for ``document``; returns the
    result and whether this call queued it.

    Creates the job (committing), or retries / revives / rebuilds the one that exists; a job
    already under way is left alone (ok, nothing queued).
    """
    version = pipeline_version
    key = idempotency_key(
        dataset_id=document.dataset_id, sha256=document.sha256, pipeline_version=version
    )
    existing = session.exec(select(Job).where(Job.idempotency_key == key)).first()
    status = existing.status if existing is not None else None
    action = ACTION_FOR_STATUS[status]
    if existing is not None and action == "underway":  # status None is "create"
        return ActionResult(
            existing.id,
            True,
            f"job {existing.id} of pipeline {version} is already {existing.status.value}",
        ), False
    transition = {"retry": retry, "revive": revive, "reindex": reindex}.get(action)
    if existing is not None and transition is not None:
        [result] = transition(session=session, job_ids=[existing.id], actor=actor, reason=reason)
        return result, result.ok
    try:
        job, created = create_job(
            session=session,
            document=document,
            pipeline_version=version,
            idempotency_key=key,
            max_attempts=max_attempts,
            actor=actor,
        )
        if created:
            add_event(
                session,
                job,
                "reindex_requested",
                actor=actor,
                to_status=JobStatus.pending,
                message=reason,
                data={"pipeline_version": version, "replaces_job": document.active_job_id},
            )
        session.commit()
    except IntegrityError:  # another reindex created it at the same moment
        session.rollback()
        return ActionResult(
            0, True, f"document {document.id}: a job of pipeline {version} was just created"
        ), False
    return ActionResult(
        job.id, True, f"job {job.id} queued to build {document.filename} with pipeline {version}"
    ), created


RESTAMPABLE = (JobStatus.pending, JobStatus.retrying, JobStatus.failed)


def restamp(
    *, session: Session, dataset_id: int, from_version: str, to_version: str, actor: str
) -> list[int]:
    """The dataset's parse settings changed from those making ``from_version`` to those making
    ``to_version``: its jobs of the old version that are not running (waiting, due for a retry, or
    dead letters) build the new version instead, or no worker would ever take them. Each by
    compare-and-set; one whose document already has a job of the new version is left alone (that
    job supersedes it when it succeeds). A job running now finishes on the old version; the
    dataset's reindex then rebuilds its document. Returns the ids restamped.

    A job that is its document's active one is never restamped: search serves its chunks under its
    version, and a re-run under another version would write chunks of both under one job id. A
    rebuild of it that waits (a reindex, a repair's rebuild, a failed attempt of one) is dropped
    instead: the job is succeeded again and a job of the new version is queued for the document
    (also when the active job is running its rebuild now)."""
    done: list[int] = []
    if from_version == to_version:
        return done
    found = session.exec(
        select(Job)
        .where(
            Job.dataset_id == dataset_id,
            Job.pipeline_version == from_version,
            col(Job.status).in_((*RESTAMPABLE, JobStatus.running)),
        )
        .order_by(col(Job.id))
    ).all()
    for job in found:
        document = stored(session, Document, job.document_id)
        key = idempotency_key(
            dataset_id=dataset_id, sha256=document.sha256, pipeline_version=to_version
        )
        if document.active_job_id == job.id:
            _replace_rebuild(session, job, document, to_version=to_version, key=key, actor=actor)
            continue
        if job.status == JobStatus.running:
            continue
        if session.exec(select(Job.id).where(Job.idempotency_key == key)).first() is not None:
            continue
        if _restamp_one(
            session, job, from_version=from_version, to_version=to_version, key=key, actor=actor
        ):
            done.append(job.id)
    return done


def _restamp_one(
    session: Session, job: Job, *, from_version: str, to_version: str, key: str, actor: str
) -> bool:
    status = job.status
    try:
        ok = _cas(
            session,
            job,
            where=[Job.status == status, Job.pipeline_version == from_version],
            pipeline_version=to_version,
            idempotency_key=key,
        )
        if ok:
            add_event(
                session,
                job,
                "restamped",
                actor=actor,
                message="the dataset's parse settings changed: this job builds pipeline "
                f"{to_version} instead of {from_version}",
                data={"from_version": from_version, "to_version": to_version},
            )
        session.commit()
        return ok
    except IntegrityError:  # a job of the new version was just made for this document
        session.rollback()
        return False


def _replace_rebuild(
    session: Session, job: Job, document: Document, *, to_version: str, key: str, actor: str
) -> None:
    """The document's active job was to be rebuilt on a version no longer in force: it serves its
    chunks again as succeeded (unless it is running that rebuild now: then the new version's job
    supersedes it), and a job of ``to_version`` is queued for the document."""
    status = job.status
    if status != JobStatus.running:
        now = db_now(session)
        if not _cas(
            session,
            job,
            where=[Job.status == status],
            status=JobStatus.succeeded,
            stage=Stage.done,
            done=job.chunk_count or 0,
            total=job.chunk_count or 0,
            finished_at=job.finished_at or now,
            next_attempt_at=None,
            cancel_requested=False,
            error_kind=None,
            error_code=None,
            error_message=None,
            fix_hint=None,
            error_detail=None,
            waiting_for=None,
            waiting_since=None,
            now=now,
        ):
            session.rollback()
            return
        add_event(
            session,
            job,
            "rebuild_dropped",
            actor=actor,
            from_status=status,
            to_status=JobStatus.succeeded,
            message=f"the dataset's parse settings changed: pipeline {to_version} is built "
            f"instead of rebuilding {job.pipeline_version}; search keeps serving this job's chunks",
            data={"to_version": to_version},
        )
    try:
        create_job(
            session=session,
            document=document,
            pipeline_version=to_version,
            idempotency_key=key,
            max_attempts=job.max_attempts,
            actor=actor,
        )
        session.commit()
    except IntegrityError:  # another change or reindex queued it at the same moment
        session.rollback()


def stamped_before(*, session: Session, job: Job, moment: datetime | None) -> bool:
    """Did the job get its pipeline version before ``moment`` (its dataset's last settings
    change)? Then the version came from settings no longer in force, which no worker makes."""
    if moment is None:
        return False
    last = session.execute(
        select(func.max(JobEvent.at)).where(
            JobEvent.job_id == job.id, col(JobEvent.kind).in_(("restamped", "version_followed"))
        )
    ).scalar()
    stamped = max(_naive(job.created_at), _naive(last)) if last is not None else job.created_at
    return _naive(stamped) < _naive(moment)


def _naive(value: datetime) -> datetime:
    return value.replace(tzinfo=None) if value.tzinfo is not None else value


def follow_version(
    *, session: Session, job_id: int, lease: int, to_version: str, actor: str, reason: str
) -> str:
    """A running attempt of a job whose pipeline version no worker makes any more (its dataset's
    settings changed since it got it, or it waited too long for a worker of it): fenced on the
    lease, it builds ``to_version`` instead. Returns what became of it:

    - ``moved``: it builds ``to_version`` now, in this attempt;
    - ``succeeded``: it is its document's active job (a rebuild of what search serves): the rebuild
      is dropped, the job serves its chunks again, and a job of ``to_version`` is queued;
    - ``superseded``: the document already has a job of ``to_version``, which builds it;
    - ``lost``: the attempt is no longer this lease's.
    """
    job = get_job(session=session, job_id=job_id)
    if job is None or job.lease != lease or job.status != JobStatus.running:
        session.rollback()
        return "lost"
    document = stored(session, Document, job.document_id, populate_existing=True)
    key = idempotency_key(
        dataset_id=job.dataset_id, sha256=document.sha256, pipeline_version=to_version
    )
    other = session.exec(select(Job.id).where(Job.idempotency_key == key)).first()
    fence = [Job.lease == lease, Job.status == JobStatus.running]
    data = {"from_version": job.pipeline_version, "to_version": to_version}
    change: dict[str, Any]
    if document.active_job_id == job.id:
        outcome, change = (
            "succeeded",
            dict(
                status=JobStatus.succeeded,
                stage=Stage.done,
                done=job.chunk_count or 0,
                total=job.chunk_count or 0,
                finished_at=job.finished_at or db_now(session),
                worker_id=None,
            ),
        )
    elif other is not None:
        outcome, change = (
            "superseded",
            dict(status=JobStatus.superseded, finished_at=db_now(session), worker_id=None),
        )
    else:
        outcome, change = "moved", dict(pipeline_version=to_version, idempotency_key=key)
    try:
        if not _cas(session, job, where=fence, **change):
            session.rollback()
            return "lost"
        add_event(
            session,
            job,
            "version_followed",
            actor=actor,
            from_status=JobStatus.running if outcome != "moved" else None,
            to_status=change.get("status"),
            message=f"{reason}: "
            + {
                "moved": f"this job builds pipeline {to_version} instead",
                "succeeded": f"its rebuild is dropped; a job of pipeline {to_version} is queued",
                "superseded": f"job {other} builds pipeline {to_version} of this document",
            }[outcome],
            data=data,
        )
        if outcome == "succeeded":
            create_job(
                session=session,
                document=document,
                pipeline_version=to_version,
                idempotency_key=key,
                max_attempts=job.max_attempts,
                actor=actor,
            )
        session.commit()
    except IntegrityError:  # a job of that version was made for the document at this moment
        session.rollback()
        return "lost"
    return outcome


def action_rejected(
    *, session: Session, job_id: int, actor: str, code: str, message: str, hint: str
) -> bool:
    """A failed job whose fix the operator tried, and that fix did not work (a wrong password): it
    stays failed as user_action_required, and its error now says why. False if it is not failed."""
    job = get_job(session=session, job_id=job_id)
    if job is None or job.status != JobStatus.failed:
        return False
    ok = _cas(
        session,
        job,
        where=[Job.status == JobStatus.failed],
        error_kind=ErrorKind.user_action_required,
        error_code=code,
        error_message=message,
        fix_hint=hint,
        error_detail=None,
    )
    if ok:
        add_event(
            session, job, "action_rejected", actor=actor, message=message, data={"code": code}
        )
    session.commit()
    return ok
