"""What the console pages read: one call per page section, each a short session over
sluice.storage.queries.

Pages get plain rows (dicts and small dataclasses), never ORM objects or sessions, and never more
than one page of jobs.
"""

from __future__ import annotations

import logging
from dataclasses import astuple, dataclass, field
from datetime import UTC, datetime, timedelta

from sqlmodel import Session, select

from sluice.errors import OperationError
from sluice.ops import documents, drain, reindex, reindex_diff
from sluice.ops import metadata as meta
from sluice.ops.access import Operator
from sluice.ops.drain import DrainEstimate
from sluice.ops.preview import SAMPLE, Preview, preview_jobs
from sluice.ops.search import query_vector
from sluice.ops.search import search as run_search
from sluice.pipeline.parsing.parse import SUPPORTED, SUPPORTED_NAMES
from sluice.pipeline.reconcile.report import last_report
from sluice.pipeline.running.context import Context, get_context
from sluice.settings import endpoint_origin, redact_url
from sluice.storage import jobs, outbox, pauses, queries, webhook_records
from sluice.storage.clock import db_now
from sluice.storage.jobs import get_job
from sluice.storage.lexical import parse_query
from sluice.storage.models import Dataset, JobStatus, utcnow

ACTIVE = tuple(s.value for s in JobStatus.active())
FINAL = tuple(s.value for s in JobStatus.final())
RATE_WINDOW_MINUTES = 60  # the drain rate is measured over this much past work

log = logging.getLogger(__name__)


def ctx() -> Context:
    return get_context()


def _session() -> Session:
    return Session(ctx().engine, expire_on_commit=False)


def _counts_session() -> Session:
    """``_session`` for the pages that read the kept counts: deltas no worker folded (none is
    up) are folded first when they pile up, so the page stays a read of a few rows."""
    from sluice.storage import tallies

    try:
        tallies.fold_if_piled(ctx().engine)
    except Exception as exc:  # a page still reads the deltas unfolded: slower, never wrong
        log.warning("kept counts not folded: %s: %s", type(exc).__name__, exc)
    return _session()


def reaper_state() -> jobs.ReaperState:
    """When any worker's reaper last ran, and whether reaping is held after a silence of all of
    them."""
    with _session() as session:
        return jobs.reaper_state(session=session)


def database_now():
    """The job database's clock: heartbeats, leases and due times are written with it, so "how long
    ago" is judged with it too (this host's clock may be off)."""
    with _session() as session:
        return db_now(session)


# --- datasets -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DatasetOption:
    id: int
    name: str


def datasets() -> list[DatasetOption]:
    with _session() as session:
        return [DatasetOption(d.id, d.name) for d in queries.datasets(session=session)]


@dataclass(frozen=True)
class PipelineView:
    """The pipeline a dataset's documents are built with (its own chunking or OCR, if it sets
    them), or the process's for all datasets."""

    version: str
    chunk_size: int
    chunk_overlap: int
    model: str
    own: bool  # the dataset sets its own parse settings


def pipeline_of(dataset_id: int | None) -> PipelineView:
    c = ctx()
    ds = None
    if dataset_id is not None:
        with _session() as session:
            ds = session.get(Dataset, dataset_id)
    s = c.settings_for(ds) if ds is not None else c.settings
    version = c.version_for(ds) if ds is not None else c.pipeline_version
    model = s.embed_model if s.embedder != "hash" else s.embedder
    return PipelineView(
        version, s.chunk_size, s.chunk_overlap, model, version != c.pipeline_version
    )


class UnknownDatasetName(OperationError):
    """A dataset name that no dataset has; the message says where to look."""

    code, status = "not_found", 404
    hint = "See the datasets' names with `sluice datasets`."


def dataset_id(name: str | None) -> int | None:
    """The id of the dataset called ``name`` (None for no name: every dataset)."""
    if not name:
        return None
    with _session() as session:
        ds = queries.dataset_by_name(session=session, name=name)
    if ds is None:
        raise UnknownDatasetName(f"no dataset named {name!r} (see `sluice datasets`)")
    return ds.id


def dataset_summaries() -> list[dict]:
    with _counts_session() as session:
        return queries.dataset_summaries(session=session)


# --- overview -------------------------------------------------------------------------------------


@dataclass
class Overview:
    counts: dict[str, int]
    oldest_pending: datetime | None
    failures: dict[str, int]
    throughput: list[dict]  # per minute, last hour
    drain: DrainEstimate
    throughput_day: list[dict] = field(default_factory=list)  # per hour, last 24 hours

    @property
    def active(self) -> int:
        return sum(self.counts.get(s, 0) for s in ACTIVE)


def rates_last_hour() -> list[dict]:
    """Chunks and jobs per second over the last hour, minute by minute, of every dataset (the
    System page's chart): each minute's finished work over its 60 seconds."""
    with _session() as session:
        minutes = queries.throughput(session=session, minutes=60)
    return [
        {
            "minute": m["minute"],
            "chunks per second": round(m["chunks"] / 60, 3),
            "jobs per second": round((m["succeeded"] + m["failed"]) / 60, 3),
        }
        for m in minutes
    ]


def overview(dataset_id: int | None) -> Overview:
    now = utcnow()
    with _counts_session() as session:
        return Overview(
            counts=queries.status_counts(session=session, dataset_id=dataset_id),
            oldest_pending=queries.oldest_waiting(session=session, dataset_id=dataset_id),
            failures=queries.failures_by_kind(session=session, dataset_id=dataset_id),
            throughput=queries.throughput(
                session=session, minutes=60, dataset_id=dataset_id, now=now
            ),
            throughput_day=queries.throughput(
                session=session, minutes=24 * 60, dataset_id=dataset_id, now=now, bucket_minutes=60
            ),
            drain=drain.estimate(
                finished=queries.recent_attempts(
                    session=session,
                    since=now - timedelta(minutes=RATE_WINDOW_MINUTES),
                    dataset_id=dataset_id,
                ),
                **_drain_work(session, dataset_id),
            ),
        )


WAITING = (JobStatus.pending, JobStatus.retrying)


def _drain_work(session: Session, dataset_id: int | None) -> dict:
    """The work the drain time is about, and the pause that holds it. Over all datasets, the
    waiting jobs of paused datasets are left out (they do not start), and when they are all the
    work there is, that is the pause that holds it."""
    work = drain.WorkLeft(*queries.remaining_work(session=session, dataset_id=dataset_id))
    paused = _drain_pause(session, dataset_id)
    if dataset_id is not None or paused:
        return {"active": work, "paused": paused}
    held = [p for p in pauses.active(session=session) if p["dataset_id"] is not None]
    parts = [
        drain.WorkLeft(
            *queries.remaining_work(session=session, dataset_id=p["dataset_id"], statuses=WAITING)
        )
        for p in held
    ]
    if not any(h.jobs for h in parts):
        return {"active": work, "paused": ""}
    on_hold = [sum(column) for column in zip(*(astuple(h) for h in parts), strict=True)]
    left = drain.WorkLeft(*(a - b for a, b in zip(astuple(work), on_hold, strict=True)))
    names = ", ".join(p["dataset"] for p, h in zip(held, parts, strict=True) if h.jobs)
    if left.jobs:
        return {"active": left, "paused": ""}
    return {"active": work, "paused": f"every waiting job is in a paused dataset ({names})"}


def _drain_pause(session: Session, dataset_id: int | None) -> str:
    """The pause that holds the work the drain time is about (the whole queue's, or the
    dataset's), as the console says it; "" when none does."""
    held = pauses.pause_for(session=session, dataset_id=dataset_id)
    return pauses.describe(held) if held else ""


@dataclass(frozen=True)
class WorkerView:
    """One consumer process as an operator reads it."""

    id: str
    host: str
    pid: int | None
    threads: int | None
    started: datetime | None
    seen_seconds_ago: float
    running: list[str]  # "job 7: embedding 32/120 chunks"

    @property
    def uptime_seconds(self) -> float | None:
        return (utcnow() - self.started).total_seconds() if self.started else None


def workers(presence: list[dict], dataset_id: int | None = None) -> list[WorkerView]:
    """Worker processes from their presence keys, each with the jobs it is running now."""
    with _session() as session:
        running = queries.running_by_worker(session=session, dataset_id=dataset_id)
    out = []
    for w in presence:
        started = w.get("started")
        out.append(
            WorkerView(
                id=str(w.get("id", "")),
                host=str(w.get("host", "")),
                pid=w.get("pid"),
                threads=w.get("threads"),
                started=datetime.fromtimestamp(float(started), UTC) if started else None,
                seen_seconds_ago=float(w.get("seen_seconds_ago", 0.0)),
                running=[
                    f"job {j.id}: {queries.job_row(j)['progress']}"
                    for j in running.get(str(w.get("id")), [])
                ],
            )
        )
    return out


# --- jobs -----------------------------------------------------------------------------------------


@dataclass
class JobsPage:
    rows: list[dict]
    total: int
    page: int
    page_size: int

    @property
    def pages(self) -> int:
        return max(1, -(-self.total // self.page_size))

    @property
    def any_active(self) -> bool:
        return any(r["status"] in ACTIVE for r in self.rows)


def jobs_page(
    f: queries.JobFilter, *, sort: str, descending: bool, page: int, page_size: int
) -> JobsPage:
    with _counts_session() as session:
        total = queries.count_jobs(session=session, f=f)
        pages = max(1, -(-total // page_size))
        page = min(max(1, page), pages)
        jobs = queries.list_jobs(
            session=session, f=f, sort=sort, descending=descending, page=page, page_size=page_size
        )
        names = queries.dataset_names(session=session)
        rows = [{**queries.job_row(j), "dataset": names.get(j.dataset_id, "")} for j in jobs]
    return JobsPage(rows, total, page, page_size)


def job_rows(ids: list[int]) -> list[dict]:
    """The public rows of these jobs, in this order (jobs that do not exist are left out)."""
    with _session() as session:
        names = queries.dataset_names(session=session)
        found = [get_job(session=session, job_id=i) for i in ids]
        return [
            {**queries.job_row(j), "dataset": names.get(j.dataset_id, "")}
            for j in found
            if j is not None
        ]


@dataclass
class Phase:
    """One stretch of a job's life: waiting in the queue, one attempt, or a backoff wait."""

    what: str
    started: datetime
    ended: datetime | None
    worker: str = ""
    outcome: str = ""
    reached: str = ""

    @property
    def seconds(self) -> float | None:
        return (self.ended - self.started).total_seconds() if self.ended else None


@dataclass
class JobDetail:
    row: dict
    dataset: str
    error_detail: str | None
    events: list[dict]
    phases: list[Phase]
    unsent: list[dict] = field(default_factory=list)
    waiting_ahead: int = 0
    published_at: datetime | None = None  # when its last queue message went out
    paused: str = ""  # the pause that keeps this waiting job from starting, in words


END_OF_PHASE = {"succeeded", "attempt_failed", "failed", "cancelled"}
START_OF_WAIT = {"created", "retried", "reindex_requested", "reuploaded", "attempt_failed"}


def phases_of(events: list[dict]) -> list[Phase]:
    """Queue waits, attempts and backoff waits, from the event log. There are no per-stage events,
    so what each attempt took is shown with the stage it reached."""
    phases: list[Phase] = []

    def close(at: datetime, outcome: str = "", reached: str = "") -> None:
        if phases and phases[-1].ended is None:
            phases[-1].ended, phases[-1].outcome = at, outcome
            if phases[-1].what.startswith("attempt"):
                phases[-1].reached = reached

    for e in events:
        kind, at = e["kind"], e["at"]
        if kind == "claimed":
            close(at, "claimed")
            phases.append(Phase(f"attempt {e['attempt']}", at, None, worker=e["actor"]))
        elif kind in END_OF_PHASE:
            close(at, kind.replace("_", " "), e["stage"] or "")
        if kind in START_OF_WAIT:
            close(at)
            phases.append(
                Phase("backoff wait" if kind == "attempt_failed" else "waiting in queue", at, None)
            )
    return phases


def job_detail(job_id: int) -> JobDetail | None:
    with _session() as session:
        job = get_job(session=session, job_id=job_id)
        if job is None:
            return None
        names = queries.dataset_names(session=session)
        events = [
            {
                "at": e.at,
                "kind": e.kind,
                "from": e.from_status,
                "to": e.to_status,
                "stage": e.stage,
                "attempt": e.attempt,
                "actor": e.actor,
                "message": e.message,
                "data": e.data,
            }
            for e in _timeline(queries.job_events(session=session, job_id=job_id))
        ]
        unsent = [
            {"since": o.created_at, "attempts": o.publish_attempts, "last_error": o.last_error}
            for o in queries.unsent_messages(session=session, job_id=job_id)
        ]
        ahead = (  # the dispatcher's order (priority, turns across datasets), as the API says it
            outbox.queue_place(
                session=session,
                job_id=job_id,
                dataset_ids=None,
                window=bool(ctx().settings.dispatch_per_thread),
            )
            if job.status == JobStatus.pending
            else 0
        )
        return JobDetail(
            row=queries.job_row(job),
            dataset=names.get(job.dataset_id, ""),
            error_detail=job.error_detail,
            events=events,
            phases=phases_of(events),
            unsent=unsent,
            waiting_ahead=ahead,
            published_at=queries.last_published(session=session, job_id=job_id),
            paused=_paused(session, job),
        )


def _timeline(events: list) -> list:
    """The job's events as the timeline shows them: of a run of ``progress`` events (stage counts,
    up to two a second while a job runs) only the last, where the job had got to."""
    return [
        e
        for e, after in zip(events, [*events[1:], None], strict=True)
        if e.kind != "progress" or after is None or after.kind != "progress"
    ]


def _paused(session: Session, job) -> str:
    if job.status not in (JobStatus.pending, JobStatus.retrying):
        return ""
    held = pauses.pause_for(session=session, dataset_id=job.dataset_id)
    return (
        pauses.describe(held, queries.dataset_names(session=session).get(job.dataset_id))
        if held
        else ""
    )


# --- dead letters ---------------------------------------------------------------------------------


def dead_letter_groups(dataset_id: int | None) -> list[dict]:
    with _session() as session:
        return queries.dead_letter_groups(session=session, dataset_id=dataset_id)


def dead_letters_in_group(
    kind: str, code: str, dataset_id: int | None, limit: int = 200
) -> list[dict]:
    with _session() as session:
        names = queries.dataset_names(session=session)
        return [
            {**queries.job_row(j), "dataset": names.get(j.dataset_id, "")}
            for j in queries.dead_letters_in_group(
                session=session, kind=kind, code=code, dataset_id=dataset_id, limit=limit
            )
        ]


def dead_letter_ids(kind: str | None, code: str | None, dataset_id: int | None) -> list[int]:
    with _session() as session:
        if kind == "unknown" or code == "unknown":
            return [
                j.id
                for j in queries.dead_letters_in_group(
                    session=session,
                    kind=kind or "unknown",
                    code=code or "unknown",
                    dataset_id=dataset_id,
                    limit=100_000,
                )
            ]
        return queries.dead_letter_ids(session=session, kind=kind, code=code, dataset_id=dataset_id)


def retry_preview(kind: str | None, code: str | None, dataset_id: int | None) -> str:
    """What retrying a dead-letter group costs: chunks already indexed, in the cache, to embed."""
    return retry_cost(dead_letter_ids(kind, code, dataset_id)).describe()


def retry_cost(job_ids: list[int]) -> Preview:
    """What retrying these jobs would embed (chunks indexed already, in the cache, to embed)."""
    return preview_jobs(ctx(), job_ids)


# --- search ---------------------------------------------------------------------------------------


def search(
    query: str,
    dataset: str | None,
    k: int,
    *,
    mode: str = "hybrid",
    filename: str | None = None,
    pages: str | None = None,
    media_type: str | None = None,
    where: dict | None = None,
    **controls,
) -> list:
    """The best chunks of one dataset (``None``: of every dataset, merged by score), from each
    document's active job only (sluice.ops.search); ``where``: a metadata filter; ``controls``:
    search's ``min_score``, ``max_chunks_per_document`` and ``dense_weight``."""
    names = [dataset] if dataset else [d.name for d in datasets()]
    # Every dataset's dense search asks with the same vector: encoded once, here.
    several = len(names) > 1 and mode in ("hybrid", "dense") and not parse_query(query).empty
    vector = query_vector(ctx(), query) if several else None
    hits = [
        h
        for name in names
        for h in run_search(
            ctx(),
            query=query,
            dataset=name,
            k=k,
            mode=mode,
            filename=filename,
            pages=pages,
            media_type=media_type,
            where=where,
            vector=vector,
            **controls,
        )
    ]
    return sorted(hits, key=lambda h: -h.score)[:k] if not dataset else hits


# --- integrity ------------------------------------------------------------------------------------


def documents_matching(dataset_id: int | None, where: dict) -> list[int]:
    """The live documents (of one dataset, or all) a metadata filter allows."""
    with Session(ctx().engine) as session:
        return meta.matching_documents(session, dataset_id, meta.parse_where(where))


def document_info(ref: str | int):
    """The document a job id or ``doc:ID`` names, with its jobs and chunks (UnknownReference if
    none)."""
    return documents.document_info(ctx(), documents.resolve(ctx(), ref))


def chunk_rate() -> float | None:
    """Chunks finished per second of busy time over the last hour, over every dataset (the
    Overview's drain rate); None when no job finished in that hour."""
    with _session() as session:
        since = utcnow() - timedelta(minutes=RATE_WINDOW_MINUTES)
        finished = queries.recent_attempts(session=session, since=since, dataset_id=None)
    return drain.estimate(finished=finished, active=drain.WorkLeft()).chunks_per_second


EACH_DATASET = reindex.EACH  # a plan's version when datasets with their own settings differ


def reindex_plan(dataset: str | None, *, sample: int = reindex.SAMPLE) -> reindex.ReindexPlan:
    """What moving every document to the pipeline version in force would do, and cost."""
    return reindex.plan(ctx(), dataset=dataset, sample=sample)


def reindex_changes(
    dataset: str | None, *, sample: int = reindex_diff.SAMPLE
) -> reindex_diff.ReindexChanges:
    """What a reindex changes in the chunks search serves, for a sample of its documents."""
    return reindex_diff.changes(ctx(), dataset=dataset, sample=sample)


_OOXML = "application/vnd.openxmlformats-officedocument"
MEDIA_TYPE_NAMES = {
    "application/pdf": "PDF",
    f"{_OOXML}.wordprocessingml.document": "Word (.docx)",
    f"{_OOXML}.presentationml.presentation": "PowerPoint (.pptx)",
    "application/epub+zip": "EPUB",
    "text/html": "HTML",
    "text/csv": "CSV",
    "text/plain": "text (.txt)",
    "text/markdown": "Markdown (.md)",
}


def supported_formats() -> tuple[str, dict[str, str]]:
    """What Sluice indexes: in words, and each media type with its short name, in parse's order."""
    return SUPPORTED_NAMES, {t: MEDIA_TYPE_NAMES.get(t, t) for t in SUPPORTED}


def reconcile_covers(report: dict, dataset: str | None) -> bool:
    """Does ``report`` speak for ``dataset`` (None: the page of all datasets)? A check of one
    dataset never stands for another's."""
    return dataset is None or report.get("scope") in (None, dataset)


def last_reconcile() -> dict | None:
    """The last reconcile report any process on this machine saved."""
    return last_report(ctx())


# --- metrics --------------------------------------------------------------------------------------


@dataclass
class MetricCounts:
    jobs: dict[tuple[str, str], int]
    oldest_pending_seconds: float
    embedded: int
    cached: int


def metric_counts() -> MetricCounts:
    """What a scrape reports of the job database's current state."""
    with _session() as session:
        oldest = queries.oldest_waiting(session=session)
        embedded, cached = queries.embedding_totals(session=session)
        found = queries.jobs_by_dataset_and_status(session=session)
        names = session.exec(select(Dataset.name)).all()
        # Every dataset with every status, 0 where none: a dashboard's rate() works from the first
        # scrape instead of from the first job of a status.
        zeros = {(name, status.value): 0 for name in names for status in JobStatus}
        return MetricCounts(
            jobs=zeros | found,
            oldest_pending_seconds=(utcnow() - oldest).total_seconds() if oldest else 0.0,
            embedded=embedded,
            cached=cached,
        )


def events_after(after_id: int, kinds: tuple[str, ...], limit: int = 10_000) -> list[dict]:
    """Audit events newer than ``after_id`` (for exporters that follow the log)."""
    with _session() as session:
        return [
            {
                "id": e.id,
                "kind": e.kind,
                "at": e.at,
                "job_id": e.job_id,
                "data": e.data or {},
                "message": e.message,
            }
            for e in queries.events_after(
                session=session, after_id=after_id, kinds=kinds, limit=limit
            )
        ]


# --- bulk actions ---------------------------------------------------------------------------------

BULK_APPLIES_TO = {  # which of the matching jobs each bulk action can change
    "retry": ["failed", "cancelled"],
    "cancel": ["pending", "retrying", "running"],
    "reindex": ["succeeded"],
    "delete": [s.value for s in JobStatus if s != JobStatus.deleted],
}


@dataclass
class BulkPreview:
    action: str
    matching: int  # jobs the filter matches
    applicable: int  # those the action applies to
    documents: int  # distinct documents among them (what delete removes)
    job_ids: list[int] = field(default_factory=list)  # those jobs (only with ids=True)
    cost: str = ""  # what retry / reindex would embed; what delete removes

    def describe(self) -> str:
        if not self.applicable:
            return f"{self.matching:,} job(s) match; none of them can be {_past(self.action)}."
        text = f"{self.matching:,} job(s) match; {self.applicable:,} can be {_past(self.action)}"
        return text + (f". {self.cost}" if self.cost else ".")


def _past(action: str) -> str:
    return {"retry": "retried", "cancel": "cancelled", "reindex": "reindexed", "delete": "deleted"}[
        action
    ]


def bulk_preview(
    action: str,
    f: queries.JobFilter,
    *,
    with_cost: bool = True,
    ids: bool = True,
    who: Operator | None = None,
) -> BulkPreview:
    """What a bulk action over everything ``f`` matches would change, and cost, before it does.
    Counted by the database; the job ids are read only with ``ids`` (to act on them), and for the
    cost only those of the sample it parses (a page that refreshes every few seconds never reads
    100,000 ids)."""
    statuses = BULK_APPLIES_TO[action]
    with _session() as session:
        matching = queries.count_jobs(session=session, f=f)
        applicable, documents = queries.count_applicable(session=session, f=f, statuses=statuses)
        # Counting the cost parses a sample of documents: work only an operator may cause (a
        # read-only browser could otherwise make the console parse on every refresh).
        may = who is None or who.can_act
        wanted = with_cost and may and applicable and action in ("retry", "reindex")
        job_ids = (
            queries.matching_job_ids(session=session, f=f, statuses=statuses)
            if ids
            else queries.matching_job_ids(session=session, f=f, statuses=statuses, limit=SAMPLE)
            if wanted
            else []
        )
    preview = BulkPreview(action, matching, applicable, documents, job_ids)
    if wanted:
        preview.cost = (
            "Cost: "
            + preview_jobs(
                ctx(), job_ids, total_jobs=applicable, total_documents=documents
            ).describe()
        )
    elif action == "delete" and applicable:
        preview.cost = (
            f"Removes {documents:,} document(s) with their chunks and files; their jobs stay as "
            "history, marked deleted"
        )
    return preview


def document_ids(job_ids: list[int]) -> dict[int, int]:
    """Document id -> the first of ``job_ids`` that belongs to it."""
    with _session() as session:
        return queries.document_ids_of_jobs(session=session, job_ids=job_ids)


# --- webhooks -------------------------------------------------------------------------------------


def webhook_log(endpoint: str | None = None, limit: int = 50, *, full: bool = False) -> dict:
    """Per endpoint (configured or still holding deliveries): counts; and the latest deliveries.
    URLs are shown with any password masked; bodies are not shown (the job page has the job).

    Without ``full`` (a read-only operator) an endpoint is only its scheme and host: Slack- and
    Teams-style URLs carry their secret in the path, and the endpoint's answer (``last_error``)
    is left out too; ``key`` tells the endpoints apart either way."""
    with _session() as session:
        summary = {row["endpoint"]: row for row in webhook_records.summary(session=session)}
        rows = webhook_records.recent(session=session, endpoint=endpoint, limit=limit)
    for url in ctx().settings.webhook_urls:
        summary.setdefault(
            url,
            {
                "endpoint": url,
                "delivered": 0,
                "waiting": 0,
                "gave_up": 0,
                "last_delivered_at": None,
            },
        )
    shown = redact_url if full else endpoint_origin
    keys = {url: i for i, url in enumerate(sorted(summary))}
    endpoints = [
        {
            **row,
            "key": keys[url],
            "endpoint": shown(url),
            "configured": url in ctx().settings.webhook_urls,
        }
        for url, row in sorted(summary.items())
    ]
    deliveries = [
        {
            "id": r.id,
            "key": keys.get(r.endpoint, -1),
            "endpoint": shown(r.endpoint),
            "event": r.event,
            "job_id": r.job_id,
            "event_id": r.event_id,
            "state": webhook_records.delivery_state(r),
            "attempts": r.attempts,
            "created_at": webhook_records.iso(r.created_at),
            "next_attempt_at": webhook_records.iso(r.next_attempt_at),
            "delivered_at": webhook_records.iso(r.delivered_at),
            "last_status": r.last_status,
            "last_error": r.last_error if full else None,
        }
        for r in rows
    ]
    return {"endpoints": endpoints, "deliveries": deliveries}
