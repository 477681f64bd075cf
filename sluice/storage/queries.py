"""Read-side queries for the console and the CLI. The database filters, sorts and pages; callers
never load all jobs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Boolean, case, func, literal
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.functions import FunctionElement
from sqlmodel import Session, col, select

from sluice.errors import ErrorKind
from sluice.storage import id_lists, tallies
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
    # only jobs of these documents (a metadata filter's): one bound parameter however many
    document_ids: list[int] | None = None


def _apply(stmt, f: JobFilter, *, ids_first: bool = False):
    if f.dataset_id is not None:
        stmt = stmt.where(Job.dataset_id == f.dataset_id)
    if f.document_ids is not None:
        stmt = stmt.where(id_lists.clause(col(Job.document_id), f.document_ids))
    if f.statuses:
        stmt = stmt.where(col(Job.status).in_([JobStatus(s) for s in f.statuses]))
    if f.stages:
        stmt = stmt.where(col(Job.stage).in_([Stage(s) for s in f.stages]))
    if f.error_kinds:
        stmt = stmt.where(col(Job.error_kind).in_([ErrorKind(k) for k in f.error_kinds]))
    if f.name_contains:
        pattern = "%" + f.name_contains.replace("%", r"\%").replace("_", r"\_") + "%"
        name = col(Job.filename)
        matched = name_like_ids_first(name, pattern, col(Job.id)) if ids_first else None
        stmt = stmt.where(matched if matched is not None else name_like(name, pattern))
    if not f.include_dismissed:
        stmt = stmt.where(col(Job.dismissed).is_(False))
    return stmt


class name_like(FunctionElement):
    """Job ``name`` matches ``pattern`` (LIKE with backslash escapes), ignoring case. PostgreSQL:
    ILIKE, which the trigram index serves (``db.add_name_search_index``). SQLite: its LIKE, which
    ignores the case of ASCII letters as its ``lower()`` does, read from the file name index."""

    type = Boolean()
    inherit_cache = True


class name_like_ids_first(FunctionElement):
    """``name_like`` for a page in another order: on SQLite, the ids whose name matches, from the
    file name index alone, so the page walks only those rows (walking the page's order and testing
    each row read every row for a name that matches none). PostgreSQL plans that itself."""

    type = Boolean()
    inherit_cache = True


@compiles(name_like)
@compiles(name_like_ids_first)
def _name_like(element, compiler, **kw) -> str:
    name, pattern = (compiler.process(c, **kw) for c in list(element.clauses)[:2])
    return f"({name} ILIKE {pattern} ESCAPE '\\')"


@compiles(name_like, "sqlite")
def _name_like_sqlite(element, compiler, **kw) -> str:
    name, pattern = (compiler.process(c, **kw) for c in element.clauses)
    return f"({name} LIKE {pattern} ESCAPE '\\')"


@compiles(name_like_ids_first, "sqlite")
def _name_like_ids_first_sqlite(element, compiler, **kw) -> str:
    name, pattern, key = (compiler.process(c, **kw) for c in element.clauses)
    table = list(element.clauses)[0].table.name
    return f"({key} IN (SELECT {key} FROM {table} WHERE {name} LIKE {pattern} ESCAPE '\\'))"


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
    order: list[Any] = (
        [column.desc(), col(Job.id).desc()] if descending else [column.asc(), col(Job.id).asc()]
    )
    # The page's ids first, then their rows: skipping the rows before a deep page walks only the
    # sort's index (created_at, id), never the rows themselves. Paging by the last row seen would
    # skip nothing, but the console jumps to any page number, which only an offset can name.
    ids = _apply(select(Job.id), f, ids_first=True).order_by(*order)
    ids = ids.offset(max(0, page - 1) * page_size).limit(page_size)
    stmt = select(Job).where(col(Job.id).in_(ids)).order_by(*order)
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
    """How many jobs ``f`` matches. By dataset, status and error kind alone (the jobs page's
    usual filters), from the counts the database keeps: a row per count, not per job."""
    f = f or JobFilter()
    if f.stages or f.name_contains or not f.include_dismissed or f.document_ids is not None:
        return session.exec(_apply(select(func.count()).select_from(Job), f)).one()
    kept = tallies.counted("job")
    stmt = select(func.coalesce(func.sum(kept.c.n), 0))
    if f.dataset_id is not None:
        stmt = stmt.where(kept.c.dataset_id == f.dataset_id)
    if f.statuses:
        stmt = stmt.where(kept.c.status.in_([JobStatus(s).value for s in f.statuses]))
    if f.error_kinds:
        stmt = stmt.where(kept.c.error_kind.in_([ErrorKind(k).value for k in f.error_kinds]))
    return int(session.execute(stmt).scalar_one())


def status_counts(*, session: Session, dataset_id: int | None = None) -> dict[str, int]:
    """Jobs per status, from the counts the database keeps (``sluice.storage.tallies``)."""
    kept = tallies.counted("job")
    stmt = select(kept.c.status, func.sum(kept.c.n)).group_by(kept.c.status)
    if dataset_id is not None:
        stmt = stmt.where(kept.c.dataset_id == dataset_id)
    counts = {s.value: 0 for s in JobStatus}
    for status, n in session.execute(stmt).all():
        if n:
            counts[JobStatus(status).value] = int(n)
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
    """Each dataset's live documents, the chunks search serves (the active job of each live
    document: during a reindex that job is pending or running again, and its chunks are still the
    ones served) and its jobs per status, from the counts the database keeps."""
    kept = tallies.counted("dataset")
    sums = {
        ds_id: (int(docs or 0), int(chunks or 0))
        for ds_id, docs, chunks in session.execute(
            select(kept.c.dataset_id, func.sum(kept.c.n), func.sum(kept.c.chunks)).group_by(
                kept.c.dataset_id
            )
        ).all()
    }
    jobs = tallies.counted("job")
    jobs_by: dict[int, dict[str, int]] = {}
    for ds_id, status, n in session.execute(
        select(jobs.c.dataset_id, jobs.c.status, func.sum(jobs.c.n)).group_by(
            jobs.c.dataset_id, jobs.c.status
        )
    ).all():
        if n:
            jobs_by.setdefault(ds_id, {})[JobStatus(status).value] = int(n)
    return [
        {
            "name": ds.name,
            "id": ds.id,
            "documents": sums.get(ds.id, (0, 0))[0],
            "chunks": sums.get(ds.id, (0, 0))[1],
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
    """Jobs finished and chunks embedded per bucket over the last ``minutes``. Whole minutes come
    from the counts the database keeps per minute of finish (``sluice.storage.tallies``): a day is
    at most 1,440 rows a dataset, however many jobs finished. The first minute, which the window
    starts inside, is counted over its jobs (an index range), so a finish before ``since`` is left
    out exactly."""
    now = now or utcnow()
    since = now - timedelta(minutes=minutes)
    width = timedelta(minutes=bucket_minutes)
    start = since.replace(second=0, microsecond=0)
    start_minute = int((start if start.tzinfo else start.replace(tzinfo=UTC)).timestamp()) // 60
    buckets: dict[datetime, dict] = {}
    t = start
    while t <= now:
        buckets[t] = {"minute": t, "succeeded": 0, "failed": 0, "chunks": 0}
        t += width
    for n, status, count, chunks in _finished_per_bucket(
        session, since, start, start_minute, bucket_minutes, dataset_id
    ):
        b = buckets.get(start + width * int(n))
        if b is None or not count:
            continue
        if JobStatus(status) == JobStatus.succeeded:
            b["succeeded"] += int(count)
            b["chunks"] += int(chunks or 0)
        else:
            b["failed"] += int(count)
    return list(buckets.values())


def _finished_per_bucket(
    session: Session,
    since: datetime,
    start: datetime,
    start_minute: int,
    bucket_minutes: int,
    dataset_id: int | None,
) -> list[tuple]:
    """(bucket, status, jobs, chunks) rows: the window's first minute over its jobs, the whole
    minutes after it from the kept counts."""
    first = (
        select(literal(0), Job.status, func.count(), func.coalesce(func.sum(Job.chunk_count), 0))
        .where(
            col(Job.finished_at) >= since,
            col(Job.finished_at) < start + timedelta(minutes=1),
            col(Job.status).in_([JobStatus.succeeded, JobStatus.failed]),
        )
        .group_by(Job.status)
    )
    kept = tallies.counted("finish")
    index = ((kept.c.minute - start_minute) // bucket_minutes).label("bucket")
    rest = (
        select(index, kept.c.status, func.sum(kept.c.n), func.sum(kept.c.chunks))
        .where(kept.c.minute > start_minute)
        .group_by(index, kept.c.status)
    )
    if dataset_id is not None:
        first = first.where(Job.dataset_id == dataset_id)
        rest = rest.where(kept.c.dataset_id == dataset_id)
    return [*session.execute(first).all(), *session.execute(rest).all()]


def failures_by_kind(*, session: Session, dataset_id: int | None = None) -> dict[str, int]:
    kept = tallies.counted("job")
    stmt = (
        select(kept.c.error_kind, func.sum(kept.c.n))
        .where(kept.c.status == JobStatus.failed.value)
        .group_by(kept.c.error_kind)
    )
    if dataset_id is not None:
        stmt = stmt.where(kept.c.dataset_id == dataset_id)
    return {
        (ErrorKind(k).value if k else "unknown"): int(n)
        for k, n in session.execute(stmt).all()
        if n
    }


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


RECENT_ATTEMPTS = 1000


def recent_attempts(
    *, session: Session, since: datetime, dataset_id: int | None = None
) -> list[tuple]:
    """(last attempt's start, finish, chunks, document bytes) of jobs that succeeded since
    ``since``, the newest ``RECENT_ATTEMPTS`` of them: the work the fleet did while it was busy
    (the drain estimate's rate). A busy fleet's hour is thousands of jobs; the newest thousand
    measure its rate as well, and read in a fixed time (the index's newest end)."""
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
    stmt = stmt.order_by(col(Job.finished_at).desc()).limit(RECENT_ATTEMPTS)
    return [tuple(r) for r in session.exec(stmt).all()]


def remaining_work(
    *,
    session: Session,
    dataset_id: int | None = None,
    statuses: Sequence[JobStatus] = JobStatus.active(),
) -> tuple[int, int, int, int]:
    """What every active job (of ``statuses``) has left, summed: (jobs, chunks left of jobs already
    embedding or indexing, jobs whose chunk count is not known yet, their document bytes), from the
    counts the database keeps as jobs change (``sluice.storage.tallies``). The rule per job is
    ``sluice.ops.drain.WorkLeft.of``."""
    kept = tallies.counted("work")
    stmt = select(
        func.sum(kept.c.n),
        func.sum(kept.c.chunks),
        func.sum(case((kept.c.error_kind == "", kept.c.n), else_=0)),
        func.sum(kept.c.size),
    ).where(kept.c.status.in_([JobStatus(s).value for s in statuses]))
    if dataset_id is not None:
        stmt = stmt.where(kept.c.dataset_id == dataset_id)
    jobs, chunks, unknown_jobs, unknown_bytes = (int(v or 0) for v in session.execute(stmt).one())
    return jobs, chunks, unknown_jobs, unknown_bytes


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
    kept = tallies.counted("job")
    stmt = (
        select(Dataset.name, kept.c.status, func.sum(kept.c.n))
        .join(Dataset, col(Dataset.id) == kept.c.dataset_id)
        .group_by(Dataset.name, kept.c.status)
    )
    return {
        (name, JobStatus(status).value): int(n)
        for name, status, n in session.execute(stmt).all()
        if n
    }


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
