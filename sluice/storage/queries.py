"""Read-side queries for the console and the CLI. The database filters, sorts and pages; callers
never load all jobs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from sqlalchemy import and_, case, func
from sqlmodel import Session, col, select

from sluice.errors import ErrorKind
from sluice.storage.clock import epoch_seconds
from sluice.storage.jobs import describe_progress
from sluice.storage.models import Dataset, Document, Job, JobEvent, JobStatus, Outbox, Stage, utcnow

SORTABLE = {
    "created": col(Job.created_at),
    "updated": col(Job.updated_at),
    "finished": col(Job.finished_at),
    "id": col(Job.id),
    "filename": col(Job.filename),
    "status": col(Job.status),
}


@dataclass
class JobFilter:
    dataset_id: int | None = None
    statuses: list[str] = field(default_factory=list)
    stages: list[str] = field(default_factory=list)
    error_kinds: list[str] = field(default_factory=list)
    name_contains: str = ""
    include_dismissed: bool = True
    document_ids: list[int] | None = None  # only jobs of these documents (a metadata filter's)


def _apply(stmt, f: JobFilter):
    if f.dataset_id is not None:
        stmt = stmt.where(Job.dataset_id == f.dataset_id)
    if f.document_ids is not None:
        stmt = stmt.where(col(Job.document_id).in_(f.document_ids))
    if f.statuses:
        stmt = stmt.where(col(Job.status).in_([JobStatus(s) for s in f.statuses]))
    if f.stages:
        stmt = stmt.where(col(Job.stage).in_([Stage(s) for s in f.stages]))
    if f.error_kinds:
        stmt = stmt.where(col(Job.error_kind).in_([ErrorKind(k) for k in f.error_kinds]))
    if f.name_contains:
        pattern = "%" + f.name_contains.replace("%", r"\%").replace("_", r"\_") + "%"
        stmt = stmt.where(col(Job.filename).ilike(pattern, escape="\\"))
    if not f.include_dismissed:
        stmt = stmt.where(col(Job.dismissed).is_(False))
    return stmt


def list_jobs(
    *,
    session: Session,
    f: JobFilter | None = None,
    sort: str = "created",
    descending: bool = True,
    page: int = 1,
    page_size: int = 50,
) -> list[Job]:
    f = f or JobFilter()
    column = SORTABLE.get(sort, SORTABLE["created"])
    order = [column.desc(), col(Job.id).desc()] if descending else [column.asc(), col(Job.id).asc()]
    stmt = (
        _apply(select(Job), f)
        .order_by(*order)
        .offset(max(0, page - 1) * page_size)
        .limit(page_size)
    )
    return list(session.exec(stmt).all())


def matching_job_ids(
    *, session: Session, f: JobFilter, statuses: list[str] | None = None, limit: int = 100_000
) -> list[int]:
    """Ids of the jobs a filter matches (narrowed to ``statuses``), oldest first."""
    stmt = _apply(select(Job.id), f)
    if statuses is not None:
        stmt = stmt.where(col(Job.status).in_([JobStatus(s) for s in statuses]))
    return list(session.exec(stmt.order_by(Job.id).limit(limit)).all())


def count_applicable(*, session: Session, f: JobFilter, statuses: list[str]) -> tuple[int, int]:
    """(jobs, distinct documents) a filter matches among ``statuses``, counted by the database."""
    stmt = _apply(
        select(func.count(), func.count(func.distinct(Job.document_id))).select_from(Job), f
    )
    jobs, documents = session.exec(
        stmt.where(col(Job.status).in_([JobStatus(s) for s in statuses]))
    ).one()
    return int(jobs), int(documents)


def count_jobs(*, session: Session, f: JobFilter | None = None) -> int:
    return session.exec(_apply(select(func.count()).select_from(Job), f or JobFilter())).one()


def status_counts(*, session: Session, dataset_id: int | None = None) -> dict[str, int]:
    stmt = select(Job.status, func.count()).group_by(Job.status)
    if dataset_id is not None:
        stmt = stmt.where(Job.dataset_id == dataset_id)
    counts = {s.value: 0 for s in JobStatus}
    for status, n in session.exec(stmt).all():
        counts[JobStatus(status).value] = n
    return counts


def datasets(*, session: Session) -> list[Dataset]:
    """The datasets one can upload to and search: not those being deleted."""
    return list(
        session.exec(
            select(Dataset).where(col(Dataset.deleting_at).is_(None)).order_by(Dataset.name)
        ).all()
    )


def dataset_by_name(*, session: Session, name: str) -> Dataset | None:
    return session.exec(select(Dataset).where(Dataset.name == name)).first()


def dataset_summaries(*, session: Session) -> list[dict]:
    docs = dict(
        session.exec(
            select(Document.dataset_id, func.count())
            .where(col(Document.deleted_at).is_(None))
            .group_by(col(Document.dataset_id))
        ).all()
    )
    # What search serves: the active job of each live document (during a reindex that job is
    # pending or running again, and its chunks are still the ones served).
    chunks = dict(
        session.exec(
            select(Job.dataset_id, func.coalesce(func.sum(Job.chunk_count), 0))
            .join(Document, col(Document.active_job_id) == Job.id)
            .where(col(Document.deleted_at).is_(None))
            .group_by(col(Job.dataset_id))
        ).all()
    )
    jobs_by: dict[int, dict[str, int]] = {}
    for ds_id, status, n in session.exec(
        select(Job.dataset_id, Job.status, func.count()).group_by(col(Job.dataset_id), Job.status)
    ).all():
        jobs_by.setdefault(ds_id, {})[JobStatus(status).value] = n
    return [
        {
            "name": ds.name,
            "id": ds.id,
            "documents": int(docs.get(ds.id, 0)),
            "chunks": int(chunks.get(ds.id) or 0),
            "jobs": jobs_by.get(ds.id, {}),
            "collection": ds.collection,
            "created_at": ds.created_at.isoformat(),
        }
        for ds in datasets(session=session)
    ]


def job_events(*, session: Session, job_id: int) -> list[JobEvent]:
    return list(
        session.exec(
            select(JobEvent).where(JobEvent.job_id == job_id).order_by(col(JobEvent.id))
        ).all()
    )


def dead_letter_groups(*, session: Session, dataset_id: int | None = None) -> list[dict]:
    """Failed, undismissed jobs grouped by kind and reason (error code), with counts and a hint."""
    stmt = (
        select(  # type: ignore[call-overload]  # sqlmodel types select() up to 4 columns
            col(Job.error_kind),
            col(Job.error_code),
            func.count(),
            func.min(Job.fix_hint),
            func.max(Job.finished_at),
        )
        .where(Job.status == JobStatus.failed, col(Job.dismissed).is_(False))
        .group_by(col(Job.error_kind), col(Job.error_code))
        .order_by(func.count().desc())
    )
    if dataset_id is not None:
        stmt = stmt.where(Job.dataset_id == dataset_id)
    return [
        {
            "kind": ErrorKind(k).value if k else "unknown",
            "code": code or "unknown",
            "count": n,
            "fix_hint": hint or "",
            "latest": latest,
        }
        for k, code, n, hint, latest in session.exec(stmt).all()
    ]


def dead_letter_ids(
    *,
    session: Session,
    kind: str | None = None,
    code: str | None = None,
    dataset_id: int | None = None,
) -> list[int]:
    stmt = select(Job.id).where(Job.status == JobStatus.failed, col(Job.dismissed).is_(False))
    if kind:
        stmt = stmt.where(Job.error_kind == ErrorKind(kind))
    if code:
        stmt = stmt.where(Job.error_code == code)
    if dataset_id is not None:
        stmt = stmt.where(Job.dataset_id == dataset_id)
    return list(session.exec(stmt.order_by(col(Job.id))).all())


def oldest_waiting(*, session: Session, dataset_id: int | None = None) -> datetime | None:
    stmt = select(func.min(Job.created_at)).where(Job.status == JobStatus.pending)
    if dataset_id is not None:
        stmt = stmt.where(Job.dataset_id == dataset_id)
    return session.exec(stmt).one()


def throughput(
    *,
    session: Session,
    minutes: int = 60,
    dataset_id: int | None = None,
    now: datetime | None = None,
    bucket_minutes: int = 1,
) -> list[dict]:
    """Jobs finished and chunks embedded per bucket over the last ``minutes`` (from the jobs' own
    finish times: nothing is kept besides the job rows). The database counts per bucket, so a day
    of 100,000 jobs is 24 rows read, not 100,000."""
    now = now or utcnow()
    since = now - timedelta(minutes=minutes)
    width = timedelta(minutes=bucket_minutes)
    start = since.replace(second=0, microsecond=0)
    # Buckets are whole minutes from a whole minute: whole seconds place every finish time exactly.
    start_s = int((start if start.tzinfo else start.replace(tzinfo=UTC)).timestamp())
    index = ((epoch_seconds(Job.finished_at) - start_s) // (bucket_minutes * 60)).label("bucket")
    stmt = (
        select(index, Job.status, func.count(), func.coalesce(func.sum(Job.chunk_count), 0))
        .where(
            col(Job.finished_at) >= since,
            col(Job.status).in_([JobStatus.succeeded, JobStatus.failed]),
        )
        .group_by("bucket", Job.status)
    )
    if dataset_id is not None:
        stmt = stmt.where(Job.dataset_id == dataset_id)

    buckets: dict[datetime, dict] = {}
    t = start
    while t <= now:
        buckets[t] = {"minute": t, "succeeded": 0, "failed": 0, "chunks": 0}
        t += width
    for n, status, count, chunks in session.exec(stmt).all():
        b = buckets.get(start + width * int(n))
        if b is None:
            continue
        if JobStatus(status) == JobStatus.succeeded:
            b["succeeded"] += count
            b["chunks"] += int(chunks or 0)
        else:
            b["failed"] += count
    return list(buckets.values())


def failures_by_kind(*, session: Session, dataset_id: int | None = None) -> dict[str, int]:
    stmt = (
        select(Job.error_kind, func.count())
        .where(Job.status == JobStatus.failed)
        .group_by(Job.error_kind)
    )
    if dataset_id is not None:
        stmt = stmt.where(Job.dataset_id == dataset_id)
    return {(ErrorKind(k).value if k else "unknown"): n for k, n in session.exec(stmt).all()}


def job_row(job: Job) -> dict:
    """The public shape of a job (CLI --json, console tables)."""
    return {
        "id": job.id,
        "dataset_id": job.dataset_id,
        "document_id": job.document_id,
        "filename": job.filename,
        "status": JobStatus(job.status).value,
        "stage": Stage(job.stage).value,
        "done": job.done,
        "total": job.total,
        "progress": describe_progress(job.stage, job.done, job.total),
        "attempt": job.attempt,
        "max_attempts": job.max_attempts,
        "error_kind": ErrorKind(job.error_kind).value if job.error_kind else None,
        "error_code": job.error_code,
        "error_message": job.error_message,
        "fix_hint": job.fix_hint,
        "cancel_requested": job.cancel_requested,
        "dismissed": job.dismissed,
        "chunk_count": job.chunk_count,
        "page_count": job.page_count,
        "pipeline_version": job.pipeline_version,
        "worker_id": job.worker_id,
        "created_at": job.created_at.isoformat() if job.created_at else None,
        "updated_at": job.updated_at.isoformat() if job.updated_at else None,
        "finished_at": job.finished_at.isoformat() if job.finished_at else None,
        "next_attempt_at": job.next_attempt_at.isoformat() if job.next_attempt_at else None,
        "heartbeat_at": job.heartbeat_at.isoformat() if job.heartbeat_at else None,
        "waiting_for": job.waiting_for,
        "waiting_since": job.waiting_since.isoformat() if job.waiting_since else None,
    }


# --- console read side (additive) -----------------------------------------------------------------


def dataset_names(*, session: Session) -> dict[int, str]:
    return {ds_id: name for ds_id, name in session.exec(select(Dataset.id, Dataset.name)).all()}


def dead_letters_in_group(
    *, session: Session, kind: str, code: str, dataset_id: int | None = None, limit: int = 200
) -> list[Job]:
    """Undismissed failed jobs of one dead-letter group (kind + error code), latest first.

    ``kind`` / ``code`` ``"unknown"`` match jobs without one, as ``dead_letter_groups`` names them.
    """
    stmt = select(Job).where(Job.status == JobStatus.failed, col(Job.dismissed).is_(False))
    stmt = stmt.where(
        col(Job.error_kind).is_(None) if kind == "unknown" else Job.error_kind == ErrorKind(kind)
    )
    stmt = stmt.where(
        col(Job.error_code).is_(None) if code == "unknown" else Job.error_code == code
    )
    if dataset_id is not None:
        stmt = stmt.where(Job.dataset_id == dataset_id)
    return list(
        session.exec(
            stmt.order_by(col(Job.finished_at).desc(), col(Job.id).desc()).limit(limit)
        ).all()
    )


def last_published(*, session: Session, job_id: int) -> datetime | None:
    """When the job's last queue message was published (None: never)."""
    return session.exec(select(func.max(Outbox.sent_at)).where(Outbox.job_id == job_id)).one()


def unsent_messages(*, session: Session, job_id: int) -> list:
    """Outbox rows of a job not yet on the queue (published later by the worker's recovery)."""
    return list(
        session.exec(
            select(Outbox)
            .where(Outbox.job_id == job_id, col(Outbox.sent_at).is_(None))
            .order_by(col(Outbox.id))
        ).all()
    )


def recent_attempts(
    *, session: Session, since: datetime, dataset_id: int | None = None
) -> list[tuple]:
    """(last attempt's start, finish, chunks, document bytes) of jobs that succeeded since
    ``since``: the work the fleet did while it was busy (the drain estimate's rate)."""
    # The last claim of each of these jobs, looked up by job id (a handful of events per job), not
    # by grouping every claim of a day.
    last_claim = (
        select(func.max(JobEvent.at))
        .where(JobEvent.job_id == Job.id, JobEvent.kind == "claimed")
        .correlate(Job)
        .scalar_subquery()
    )
    stmt = (
        select(
            func.coalesce(last_claim, Job.started_at),
            Job.finished_at,
            Job.chunk_count,
            Document.size,
        )
        .join(Document, col(Document.id) == Job.document_id)
        .where(Job.status == JobStatus.succeeded, col(Job.finished_at) >= since)
    )
    if dataset_id is not None:
        stmt = stmt.where(Job.dataset_id == dataset_id)
    return [tuple(r) for r in session.exec(stmt.limit(5000)).all()]


def remaining_work(
    *,
    session: Session,
    dataset_id: int | None = None,
    statuses: Sequence[JobStatus] = JobStatus.active(),
) -> tuple[int, int, int, int]:
    """What every active job (of ``statuses``) has left, summed by the database: (jobs, chunks left
    of jobs already embedding or indexing, jobs whose chunk count is not known yet, their document
    bytes). The rule per job is ``sluice.ops.drain.WorkLeft.of``."""
    known = and_(col(Job.stage).in_([Stage.embedding, Stage.indexing]), col(Job.total) > 0)
    left = case(
        (and_(col(Job.stage) == Stage.embedding, col(Job.total) > Job.done), Job.total - Job.done),
        else_=0,
    )
    stmt = (
        select(
            func.count(),
            func.sum(case((known, left), else_=0)),
            func.sum(case((known, 0), else_=1)),
            func.sum(case((known, 0), else_=func.coalesce(Document.size, 0))),
        )
        .join(Document, col(Document.id) == Job.document_id)
        .where(col(Job.status).in_(list(statuses)))
    )
    if dataset_id is not None:
        stmt = stmt.where(Job.dataset_id == dataset_id)
    jobs, chunks, unknown_jobs, unknown_bytes = session.exec(stmt).one()
    return int(jobs), int(chunks or 0), int(unknown_jobs or 0), int(unknown_bytes or 0)


def running_by_worker(*, session: Session, dataset_id: int | None = None) -> dict[str, list[Job]]:
    """Running jobs grouped by the worker (host:pid) that holds them."""
    stmt = select(Job).where(Job.status == JobStatus.running).order_by(col(Job.id))
    if dataset_id is not None:
        stmt = stmt.where(Job.dataset_id == dataset_id)
    out: dict[str, list[Job]] = {}
    for job in session.exec(stmt).all():
        out.setdefault(job.worker_id or "", []).append(job)
    return out


# --- metrics --------------------------------------------------------------------------------------


def jobs_by_dataset_and_status(*, session: Session) -> dict[tuple[str, str], int]:
    stmt = (
        select(Dataset.name, Job.status, func.count())
        .join(Dataset, col(Dataset.id) == Job.dataset_id)
        .group_by(Dataset.name, Job.status)
    )
    return {(name, JobStatus(status).value): n for name, status, n in session.exec(stmt).all()}


def embedding_totals(*, session: Session) -> tuple[int, int]:
    """(chunks the model encoded, chunks the cache served), over the last attempt of every job."""
    embedded, cached = session.exec(
        select(
            func.coalesce(func.sum(Job.embedded_count), 0),
            func.coalesce(func.sum(Job.cached_count), 0),
        )
    ).one()
    return int(embedded), int(cached)


def events_after(
    *, session: Session, after_id: int, kinds: tuple[str, ...], limit: int
) -> list[JobEvent]:
    """Events of these kinds with an id above ``after_id``, oldest first (a tail of the audit
    log)."""
    stmt = (
        select(JobEvent)
        .where(col(JobEvent.id) > after_id, col(JobEvent.kind).in_(kinds))
        .order_by(col(JobEvent.id))
        .limit(limit)
    )
    return list(session.exec(stmt).all())


def document_ids_of_jobs(*, session: Session, job_ids: list[int]) -> dict[int, int]:
    """The distinct documents of these jobs, each with the first of those jobs (in job order)."""
    found: dict[int, int] = {}
    for start in range(0, len(job_ids), 1000):
        part = job_ids[start : start + 1000]
        for job_id, doc_id in session.exec(
            select(Job.id, Job.document_id).where(col(Job.id).in_(part)).order_by(col(Job.id))
        ).all():
            found.setdefault(doc_id, job_id)
    return found


def count_existing_jobs(*, session: Session, job_ids: list[int]) -> int:
    """How many of these ids are jobs that exist."""
    return sum(
        session.exec(
            select(func.count())
            .select_from(Job)
            .where(col(Job.id).in_(job_ids[start : start + 1000]))
        ).one()
        for start in range(0, len(job_ids), 1000)
    )
