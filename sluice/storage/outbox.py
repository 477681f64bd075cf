"""The transactional outbox: rows written with the job, published to the queue afterwards.

Publishing needs the queue; this module takes a ``publish(job_id)`` callable so that storage does
not import Huey. A failed publish leaves the row unsent; the recovery loop tries again.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import exists, func, or_, update
from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from sluice import faults
from sluice.storage import pauses
from sluice.storage.clock import db_now
from sluice.storage.jobs import CLAIMABLE, republish
from sluice.storage.models import Dataset, Job, JobStatus, Outbox


@dataclass
class DispatchResult:
    sent: list[int] = field(default_factory=list)
    skipped: int = 0
    error: str | None = None


def dispatch(
    *, engine: Engine, publish: Callable[[int], None], limit: int = 1000, window: int = 0
) -> DispatchResult:
    """Publish due outbox rows, the most urgent first; stop at the first publish error (the queue is down).

    With a ``window``, only that many messages are kept on the queue (published, not yet claimed):
    the rows chosen are the highest priority, then the dataset with the least work in flight or
    running, then the oldest (see ``choose``). Without one, every due row goes, by priority then age.

    Rows are first marked sent in one conditional UPDATE, so concurrent dispatchers (every worker
    and console runs one) never publish the same row twice; rows that could not be published are
    handed back.
    """
    result = DispatchResult()
    with Session(engine) as session:
        now = db_now(session)
        due = choose(session=session, now=now, limit=limit, window=window)
        if not due:
            return result
        claimed = set(
            session.execute(
                update(Outbox)
                .where(Outbox.id.in_([row_id for row_id, _, _ in due]), Outbox.sent_at.is_(None))
                .values(sent_at=now, publish_attempts=Outbox.publish_attempts + 1)
                .returning(Outbox.id)
            )
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
                .where(Outbox.id.in_(skipped))
                .values(last_error="not published: the job no longer waits to run")
            )
            result.skipped = len(skipped)
        if failed:
            session.execute(
                update(Outbox)
                .where(Outbox.id.in_(failed))
                .values(sent_at=None, last_error=result.error)
            )
        session.commit()
    return result


def _priority() -> Any:
    return func.coalesce(Job.priority, Dataset.priority, 0)


def _due(now: datetime) -> list[Any]:
    return [Outbox.sent_at.is_(None), Outbox.available_at <= now, ~pauses.covering(Job.dataset_id)]


def load_by_dataset(*, session: Session) -> tuple[int, dict[int, int]]:
    """Messages in flight (jobs waiting whose message was sent and not yet claimed), and per dataset
    those plus its running jobs."""
    unsent = exists().where(Outbox.job_id == Job.id, Outbox.sent_at.is_(None))
    rows = session.execute(
        select(Job.dataset_id, Job.status, func.count())
        .where(
            Job.status.in_((*CLAIMABLE, JobStatus.running)),
            or_(Job.status == JobStatus.running, ~unsent),
        )
        .group_by(Job.dataset_id, Job.status)
    ).all()
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
                .join(Job, Job.id == Outbox.job_id)
                .join(Dataset, Dataset.id == Job.dataset_id)
                .where(*_due(now))
                .order_by(_priority().desc(), Outbox.id)
                .limit(limit)
            ).all()
        ]
    in_flight, load = load_by_dataset(session=session)
    room = min(limit, window - in_flight)
    if room <= 0:
        return []
    rank = func.row_number().over(
        partition_by=Job.dataset_id, order_by=(_priority().desc(), Outbox.id)
    )
    heads = (
        select(
            Outbox.id.label("row_id"),
            Outbox.job_id,
            Job.status,
            Job.dataset_id,
            _priority().label("priority"),
            rank.label("rank"),
        )
        .join(Job, Job.id == Outbox.job_id)
        .join(Dataset, Dataset.id == Job.dataset_id)
        .where(*_due(now))
        .subquery()
    )
    queues: dict[int, deque] = defaultdict(deque)
    for row in session.execute(
        select(heads).where(heads.c.rank <= room).order_by(heads.c.rank)
    ).all():
        queues[row.dataset_id].append(row)
    chosen = []
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


def unsent_count(*, session: Session) -> int:
    return session.exec(
        select(func.count()).select_from(Outbox).where(Outbox.sent_at.is_(None))
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
            func.count(Outbox.id).filter(Outbox.sent_at.is_(None)).label("unsent"),
        )
        .group_by(Outbox.job_id)
        .subquery()
    )
    # A job with no outbox row at all (retention pruned its published one) is stranded too, by the
    # time of its last change: nothing else would ever publish it.
    candidates = session.exec(
        select(Job)
        .outerjoin(last_sent, last_sent.c.job_id == Job.id)
        .where(
            Job.status.in_(CLAIMABLE),
            ~pauses.covering(Job.dataset_id),
            (Job.next_attempt_at.is_(None)) | (Job.next_attempt_at <= cutoff),
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
