"""The transactional outbox: rows written with the job, published to the queue afterwards.

Publishing needs the queue; this module takes a ``publish(job_id)`` callable so that storage does
not import Huey. A failed publish leaves the row unsent; the recovery loop tries again.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any

from sqlalchemy import (
    Integer,
    and_,
    bindparam,
    exists,
    func,
    or_,
    text,
    true,
    union_all,
    update,
)
from sqlalchemy import select as sql_select
from sqlalchemy.engine import Engine
from sqlalchemy.orm import aliased
from sqlmodel import Session, col, select

from sluice import faults
from sluice.storage import pauses
from sluice.storage.clock import as_utc, current_time, db_now
from sluice.storage.jobs import CLAIMABLE, republish
from sluice.storage.models import Dataset, Job, JobStatus, Outbox, Pause


@dataclass
class DispatchResult:
    sent: list[int] = field(default_factory=list)
    skipped: int = 0
    error: str | None = None


def dispatch(
    *, engine: Engine, publish: Callable[[int], None], limit: int = 1000, window: int = 0
) -> DispatchResult:
    """Publish due outbox rows, the most urgent first; stop at the first publish error (the queue is
    down).

    With a ``window``, only that many messages are kept on the queue (published, not yet claimed):
    the rows chosen are the highest priority, then the dataset with the least work in flight or
    running, then the oldest (see ``choose``). Without one, every due row goes, by priority then
    age.

    Rows are first marked sent in one conditional UPDATE, so concurrent dispatchers (every worker
    and console runs one) never publish the same row twice; rows that could not be published are
    handed back.
    """
    result = DispatchResult()
    with Session(engine) as session:
        # The time, and whether any row waits at all, in one statement: every worker claim and every
        # upload dispatches, and mostly nothing waits (the choice below is three more statements,
        # about a tenth of a small job's time in the worker).
        stamp, waiting = session.execute(_TIME_AND_WAITING).one()
        if not waiting:
            return result
        now = as_utc(stamp)
        due = choose(session=session, now=now, limit=limit, window=window)
        if not due:
            return result
        claimed = set(
            session.execute(_MARK_SENT, {"ids": [row_id for row_id, _, _ in due], "sent": now})
            .scalars()
            .all()
        )
        session.commit()
        skipped, failed = [], []
        for row_id, job_id, status in due:
            if row_id not in claimed:
                continue  # another dispatcher has it
            if status not in CLAIMABLE:
                skipped.append(row_id)  # nothing to run any more (cancelled, succeeded...)
                continue
            if result.error is not None:
                failed.append(row_id)
                continue
            try:
                publish(job_id)
                result.sent.append(job_id)
            except Exception as exc:  # the queue Redis is down: hand the rest back for later
                result.error = f"{type(exc).__name__}: {exc}"[:500]
                failed.append(row_id)
        if skipped:
            session.execute(
                update(Outbox)
                .where(col(Outbox.id).in_(skipped))
                .values(last_error="not published: the job no longer waits to run", in_flight=None)
            )
            result.skipped = len(skipped)
        if failed:
            session.execute(
                update(Outbox)
                .where(col(Outbox.id).in_(failed))
                .values(sent_at=None, last_error=result.error, in_flight=None)
            )
        session.commit()
    return result


def _priority() -> Any:
    return func.coalesce(Job.priority, Dataset.priority, 0)


def _due(now: datetime) -> list[Any]:
    return [
        col(Outbox.sent_at).is_(None),
        Outbox.available_at <= now,
        ~pauses.covering(Job.dataset_id),
    ]


_OTHER_ROW = aliased(Outbox)  # made once: building an alias costs milliseconds


def _unsent() -> Any:
    """SQL condition: the job has a row not yet published (an alias of its own, so that a query
    over the outbox may use it)."""
    return exists().where(col(_OTHER_ROW.job_id) == Job.id, col(_OTHER_ROW.sent_at).is_(None))


def _load_rows(session: Session) -> list[Any]:
    """(dataset id, status, jobs) of the jobs in flight (waiting, message sent and not yet claimed)
    and running."""
    return list(session.execute(_LOAD_ROWS).all())


def load_by_dataset(*, session: Session) -> tuple[int, dict[int, int]]:
    """Messages in flight (jobs waiting whose message was sent and not yet claimed), and per dataset
    those plus its running jobs. Read from the rows marked in flight and the running jobs: its work
    does not grow with the jobs waiting in the outbox."""
    rows = _load_rows(session)
    load: dict[int, int] = defaultdict(int)
    for dataset_id, _, n in rows:
        load[dataset_id] += n
    return sum(n for _, status, n in rows if status != JobStatus.running), load


def choose(
    *, session: Session, now: datetime, limit: int, window: int
) -> list[tuple[int, int, JobStatus]]:
    """The due outbox rows to publish now: (row id, job id, job status), in publishing order.

    With a window: as many as it has room for; each next one is the head of the dataset whose head
    has the highest priority, then the least work in flight and running, then the oldest row. So a
    dataset with thousands of jobs queued and another with one take turns; "run next" (a higher job
    priority) goes before both.
    """
    if not window:
        return [
            tuple(r)
            for r in session.execute(
                select(Outbox.id, Outbox.job_id, Job.status)
                .join(Job, col(Job.id) == Outbox.job_id)
                .join(Dataset, col(Dataset.id) == Job.dataset_id)
                .where(*_due(now))
                .order_by(_priority().desc(), col(Outbox.id))
                .limit(limit)
            ).all()
        ]
    in_flight, load = load_by_dataset(session=session)
    room = min(limit, window - in_flight)
    if room <= 0:
        return []
    queues: dict[int, deque] = defaultdict(deque)
    for row in heads(session=session, now=now, room=room):
        queues[row.dataset_id].append(row)
    chosen: list[tuple[int, int, JobStatus]] = []
    while queues and len(chosen) < room:
        dataset_id = min(
            queues, key=lambda d: (-queues[d][0].priority, load[d], queues[d][0].row_id)
        )
        row = queues[dataset_id].popleft()
        chosen.append((row.row_id, row.job_id, JobStatus(row.status)))
        load[dataset_id] += 1
        if not queues[dataset_id]:
            del queues[dataset_id]
    return chosen


@dataclass(frozen=True)
class Head:
    """A due outbox row as the dispatcher ranks it."""

    row_id: int
    job_id: int
    status: str
    dataset_id: int
    priority: int


def _head_columns() -> tuple[Any, ...]:
    return (
        col(Outbox.id),
        col(Outbox.job_id),
        col(Job.status),
        col(Job.dataset_id),
        _priority(),
    )


def heads(*, session: Session, now: datetime, room: int) -> list[Head]:
    """The first ``room`` due rows of each dataset with any, by priority (highest first) then row
    id, each dataset's in that order: what ``choose`` takes its turns from.

    Read from indexes whatever the backlog (ranking every due row made each claim grow with it:
    BENCHMARKS.md): the datasets with unsent rows, then in one
    statement each dataset's first ``room`` unsent rows of jobs without a priority of their own, in
    row order (they all share the dataset's priority, so no later one of them can rank before
    these), and apart the rare rows whose job has a priority of its own, and any row written
    without its dataset."""
    paused = set(session.execute(_PAUSED).scalars())
    if None in paused:
        return []  # the whole queue is paused
    dataset_ids = [
        d for d in session.execute(_DATASETS_WAITING).scalars() if d is not None and d not in paused
    ]
    found: dict[int, Head] = {}

    def take(statement: Any, due_by: datetime | None = None, **params: Any) -> None:
        """Keep the heads ``statement`` reads; with ``due_by``, its last column is when each row
        is due, and only the rows due by then count."""
        for row in session.execute(statement, params).all():
            values = list(row)
            if due_by is not None and as_utc(values.pop()) > due_by:
                continue
            head = Head(*values)
            if head.dataset_id not in paused:
                found[head.row_id] = head

    for start in range(0, len(dataset_ids), _HEAD_QUERIES):
        part = dataset_ids[start : start + _HEAD_QUERIES]
        take(
            _first_rows_of(len(part)),
            now_=now,
            room=room,
            **{f"d{i}": d for i, d in enumerate(part)},
        )
    # Apart, and without the time in SQL, so that the planner cannot walk every unsent row by the
    # other index (it would, given "sent_at IS NULL AND available_at <= now"): the jobs with a
    # priority of their own, from their index, then their unsent rows; and rows without a dataset.
    prioritised = list(session.execute(_PRIORITISED).scalars())
    for start in range(0, len(prioritised), 500):
        take(_ROWS_OF_JOBS, now, jobs=prioritised[start : start + 500])
    take(_ROWS_WITHOUT_DATASET, now)
    ranked: dict[int, list[Head]] = defaultdict(list)
    for head in found.values():
        ranked[head.dataset_id].append(head)
    out: list[Head] = []
    for rows in ranked.values():
        rows.sort(key=lambda h: (-h.priority, h.row_id))
        out.extend(rows[:room])
    return out


# The datasets with unsent rows, one index seek each (a loose index scan: DISTINCT would walk every
# unsent row).
_DATASETS_WAITING = text(
    "WITH RECURSIVE waiting(id) AS ("
    " SELECT min(dataset_id) FROM outbox WHERE sent_at IS NULL"
    " UNION ALL"
    " SELECT (SELECT min(o.dataset_id) FROM outbox o"
    " WHERE o.sent_at IS NULL AND o.dataset_id > waiting.id)"
    " FROM waiting WHERE waiting.id IS NOT NULL"
    ") SELECT id FROM waiting WHERE id IS NOT NULL"
)
_HEAD_QUERIES = 200  # datasets per statement (SQLite allows 500 parts in one compound select)


def _joined(statement: Any) -> Any:
    return statement.join(Job, col(Job.id) == Outbox.job_id).join(
        Dataset, col(Dataset.id) == Job.dataset_id
    )


# Statements made once (SQLAlchemy then reuses their cache key and compiled form: building and
# keying them anew was most of what a dispatch cost the worker's Python).
_TIME_AND_WAITING = select(current_time(), exists().where(col(Outbox.sent_at).is_(None)))
_MARK_SENT = (
    update(Outbox)
    .where(col(Outbox.id).in_(bindparam("ids", expanding=True)), col(Outbox.sent_at).is_(None))
    .values(sent_at=bindparam("sent"), publish_attempts=Outbox.publish_attempts + 1, in_flight=True)
    .returning(col(Outbox.id))
)
# The jobs in flight, from the rows whose message is on the queue (``in_flight``: set here when a
# row is marked sent, cleared by the claim that takes the message), so the read is as long as the
# window, not the backlog: each row's job still waits (pending or retrying) with no unsent row of
# its own (a job published again waits for that one). Then the running jobs, from their index.
_LOAD_ROWS = union_all(
    sql_select(col(Job.dataset_id), col(Job.status), func.count(func.distinct(Job.id)))
    .select_from(Outbox)
    .join(Job, col(Job.id) == Outbox.job_id)
    .where(col(Outbox.in_flight) == true(), col(Job.status).in_(CLAIMABLE), ~_unsent())
    .group_by(col(Job.dataset_id), Job.status),
    sql_select(col(Job.dataset_id), col(Job.status), func.count())
    .where(col(Job.status) == JobStatus.running)
    .group_by(col(Job.dataset_id), Job.status),
)
_PAUSED = select(Pause.dataset_id)
_PRIORITISED = select(Job.id).where(col(Job.priority).is_not(None))
_ROWS_OF_JOBS = _joined(sql_select(*_head_columns(), col(Outbox.available_at))).where(
    col(Outbox.sent_at).is_(None), col(Outbox.job_id).in_(bindparam("jobs", expanding=True))
)
_ROWS_WITHOUT_DATASET = _joined(sql_select(*_head_columns(), col(Outbox.available_at))).where(
    col(Outbox.sent_at).is_(None), col(Outbox.dataset_id).is_(None)
)


@lru_cache(maxsize=64)
def _first_rows_of(datasets: int) -> Any:
    """One statement: for each of ``datasets`` datasets (parameters ``d0``, ``d1``...), its first
    ``room`` unsent rows due by ``now_`` of jobs without a priority of their own, in row order.
    Made once per number of datasets, so that SQLAlchemy compiles it once."""
    parts = [
        _joined(sql_select(*_head_columns()))
        .where(
            col(Outbox.sent_at).is_(None),
            # the time as an expression, so that the planner walks this query's index, not the
            # other index of unsent rows (by time), which would take all of them and sort them
            func.coalesce(Outbox.available_at, Outbox.available_at) <= bindparam("now_"),
            col(Outbox.dataset_id) == bindparam(f"d{i}"),
            col(Job.priority).is_(None),
        )
        .order_by(col(Outbox.id))
        .limit(bindparam("room", type_=Integer))
        .subquery()
        for i in range(datasets)
    ]
    return union_all(*[sql_select(*part.c) for part in parts])


@dataclass(frozen=True)
class Tier:
    """One dataset's due rows as one waiting row sees them: of a higher priority than its own, of
    the same priority, and of the same priority with a lower row id."""

    above: int = 0
    level: int = 0
    level_before: int = 0


def turns_before(*, own: int, load: dict[int, int], tiers: dict[int, Tier]) -> int:
    """How many due rows ``choose`` publishes before a row of dataset ``own``, in closed form.

    Every row of a higher priority goes first, in any dataset (a head of a higher priority always
    wins). Among the rows of the row's own priority, each turn goes to the dataset with the least
    load (then the lower row id), and a turn adds one to its load: when the row's turn comes its
    dataset's load is T (its load, plus its rows ahead of it), and every other dataset has sent the
    rows it had below a load of T, and the one at T if that row's id is lower."""
    mine = tiers.get(own, Tier())
    ahead = mine.above + mine.level_before
    turn = load.get(own, 0) + ahead
    for dataset_id, tier in tiers.items():
        if dataset_id == own:
            continue
        k = turn - (load.get(dataset_id, 0) + tier.above)  # its rows sent before reaching T
        ahead += tier.above + min(tier.level, max(0, k))
        if 0 <= k < tier.level and k < tier.level_before:
            ahead += 1
    return ahead


def _in_flight_before(session: Session, job_id: int, dataset_ids: Collection[int] | None) -> int:
    """Waiting jobs whose message is on the queue and was sent before this job's (all of them if
    this job has none): the queue hands them out first. Messages of one dispatch round share their
    time, and their row ids stand for their order. Read from the rows in flight (an index)."""
    mine = session.execute(
        select(Outbox.sent_at, Outbox.id)
        .where(Outbox.job_id == job_id, col(Outbox.sent_at).is_not(None))
        .order_by(col(Outbox.id).desc())
        .limit(1)
    ).first()
    stmt = (
        select(func.count(func.distinct(Outbox.job_id)))
        .join(Job, col(Job.id) == Outbox.job_id)
        .where(col(Outbox.in_flight) == true(), col(Job.status).in_(CLAIMABLE), ~_unsent())
        .where(Job.id != job_id)
    )
    if mine is not None:
        earlier = and_(Outbox.sent_at == mine.sent_at, Outbox.id < mine.id)
        stmt = stmt.where(or_(Outbox.sent_at < mine.sent_at, earlier))
    if dataset_ids is not None:
        stmt = stmt.where(col(Job.dataset_id).in_(list(dataset_ids)))
    return int(session.execute(stmt).scalar() or 0)


def queue_place(
    *, session: Session, job_id: int, dataset_ids: Collection[int] | None, window: bool
) -> int:
    """How many waiting jobs start before this one, the way the dispatcher orders them: the
    messages already on the queue, then the outbox in ``choose``'s order (with a window: priority,
    then turns by load, then age; without one: priority, then age). Only the datasets in
    ``dataset_ids`` are looked at (None: every one), so the count says nothing of the others."""
    now = db_now(session)
    mine = session.execute(
        select(Outbox.id, _priority().label("priority"), Job.dataset_id)
        .join(Job, col(Job.id) == Outbox.job_id)
        .join(Dataset, col(Dataset.id) == Job.dataset_id)
        .where(Outbox.job_id == job_id, col(Outbox.sent_at).is_(None))
        .order_by(col(Outbox.id))
        .limit(1)
    ).first()
    if mine is None:  # its message is on the queue already
        return _in_flight_before(session, job_id, dataset_ids)
    seen = set(dataset_ids) if dataset_ids is not None else None
    rows = _load_rows(session)
    in_flight = sum(n for d, st, n in rows if st != JobStatus.running and _in(d, seen))
    load: dict[int, int] = defaultdict(int)
    for dataset_id, _, n in rows:
        load[dataset_id] += n
    level = _priority() == mine.priority
    stmt = (
        select(
            Job.dataset_id,
            func.count().filter(_priority() > mine.priority),
            func.count().filter(level),
            func.count().filter(level, Outbox.id < mine.id),
        )
        .join(Job, col(Job.id) == Outbox.job_id)
        .join(Dataset, col(Dataset.id) == Job.dataset_id)
        .where(*_due(now), col(Job.status).in_(CLAIMABLE), Outbox.id != mine.id)
        .group_by(col(Job.dataset_id))
    )
    if seen is not None:
        stmt = stmt.where(col(Job.dataset_id).in_(sorted(seen)))
    tiers = {d: Tier(a, n, b) for d, a, n, b in session.execute(stmt).all()}
    if not window:
        return in_flight + sum(t.above + t.level_before for t in tiers.values())
    return in_flight + turns_before(own=mine.dataset_id, load=load, tiers=tiers)


def _in(dataset_id: int, seen: set[int] | None) -> bool:
    return seen is None or dataset_id in seen


def unsent_count(*, session: Session) -> int:
    return session.exec(
        select(func.count()).select_from(Outbox).where(col(Outbox.sent_at).is_(None))
    ).one()


def redeliver_stranded(
    *, session: Session, older_than_seconds: float, queued_job_ids: Collection[int]
) -> list[int]:
    """Publish again jobs that wait for a message that no longer exists.

    A job is stranded when it is pending or due for retry, its last message was sent more than
    ``older_than_seconds`` ago, no unsent outbox row is waiting, and its id is in neither the queue
    nor the schedule (``queued_job_ids``, read from the queue Redis). That happens when the queue
    Redis lost data or a worker died holding the message before it claimed the job.
    """
    now = db_now(session)
    cutoff = now - timedelta(seconds=older_than_seconds)
    last_sent = (
        select(
            Outbox.job_id,
            func.max(Outbox.sent_at).label("last_sent"),
            func.count(col(Outbox.id)).filter(col(Outbox.sent_at).is_(None)).label("unsent"),
        )
        .group_by(col(Outbox.job_id))
        .subquery()
    )
    # A job with no outbox row at all (retention pruned its published one) is stranded too, by the
    # time of its last change: nothing else would ever publish it.
    candidates = session.exec(
        select(Job)
        .outerjoin(last_sent, last_sent.c.job_id == Job.id)
        .where(
            col(Job.status).in_(CLAIMABLE),
            ~pauses.covering(Job.dataset_id),
            (col(Job.next_attempt_at).is_(None)) | (col(Job.next_attempt_at) <= cutoff),
            func.coalesce(last_sent.c.unsent, 0) == 0,
            func.coalesce(last_sent.c.last_sent, Job.updated_at) < cutoff,
        )
        .limit(1000)
    ).all()
    republished = []
    for job in candidates:
        if job.id in queued_job_ids:
            continue
        faults.hit("redeliver_selected", job_id=job.id)
        if republish(
            session=session, job=job, now=now
        ):  # else another recovery loop or a claim won
            republished.append(job.id)
    session.commit()
    return republished


__all__ = ["DispatchResult", "dispatch", "redeliver_stranded", "unsent_count", "JobStatus"]
