"""A job published again: through its outbox row, in the transition's transaction."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import update
from sqlmodel import Session, col

from sluice.storage.clock import db_now
from sluice.storage.db import matched
from sluice.storage.jobs.conditional import CLAIMABLE_NOW, compare_and_set
from sluice.storage.jobs.event_log import add_event, value_of
from sluice.storage.models import Job, Outbox


def publish(session: Session, job: Job, at: datetime | None = None) -> None:
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
    if not compare_and_set(session, job, CLAIMABLE_NOW, now=now):
        return False
    add_event(
        session,
        job,
        "republished",
        message="its queue message was lost; published again",
        data={"status": value_of(job.status)},
    )
    publish(session, job, now)
    return True
