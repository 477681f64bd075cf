"""The reaper: running jobs whose heartbeat went silent are taken back, the fleet's ticks kept."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlmodel import Session, col, select

from sluice import faults
from sluice.errors import ErrorKind
from sluice.storage.clock import db_now
from sluice.storage.jobs.endings import fail
from sluice.storage.jobs.event_log import describe_progress
from sluice.storage.jobs.job_values import JobError
from sluice.storage.jobs.retry_policy import RetryPolicy
from sluice.storage.models import Instance, Job, JobStatus


@dataclass(frozen=True)
class ReaperTick:
    wait: float  # seconds before the reapers may take running jobs back (0: now)
    silence: bool  # this tick found a silence of every reaper (and started a new grace)
    # the fleet's hold this tick read (``instance.reap_after``): a later silence makes a new one
    hold: datetime | None = None


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
    hold = row.reap_after
    session.add(row)
    session.commit()
    return ReaperTick(wait, silence, hold)


@dataclass(frozen=True)
class ReaperState:
    """What the fleet's reapers last did, on the database's clock (see ``reaper_tick``)."""

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


def _newer_hold(session: Session, seen: object) -> bool:
    """Is a hold other than ``seen`` in force now (a silence recorded since)?"""
    now = db_now(session)
    row = session.exec(select(Instance)).first()
    session.rollback()
    if row is None or row.reap_after is None or _held_for(row, now) <= 0:
        return False
    return seen is None or _as_naive(row.reap_after) != _as_naive(seen)  # type: ignore[arg-type]


def _as_naive(value: datetime) -> datetime:
    return value.replace(tzinfo=None) if value.tzinfo is not None else value


def reap(
    *,
    session: Session,
    lease_seconds: float,
    base_delay: float,
    max_delay: float,
    now: datetime | None = None,
    fleet_hold: datetime | None | object = ...,
) -> list[int]:
    """Take back running jobs whose heartbeat is older than the lease; returns their ids.

    Only running jobs have heartbeats; a job waiting in the queue is pending or retrying and is
    never touched here. Each job is taken back by compare-and-set on what the reaper read: the same
    lease, still running, heartbeat still stale. A beat that lands after the read, or a claim by a
    healthy worker meanwhile, wins over the reaper.

    ``fleet_hold`` (a recovery round's: the hold its tick read, ``ReaperTick.hold``): before each
    job is taken back the fleet's hold is read again, and once another reaper recorded a newer
    silence (its grace running now) nothing more is taken back: this round's idea of the heartbeats
    is older than that outage.
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
    retry = RetryPolicy(base_delay, max_delay)
    taken = []
    for job_id, lease, beat, worker, stage, done, total in stale:
        faults.hit("reap_selected", job_id=job_id)
        if fleet_hold is not ... and _newer_hold(session, fleet_hold):
            break
        silent = (now - beat).total_seconds()
        lost = JobError(
            ErrorKind.transient,
            "worker_lost",
            f"worker {worker} stopped answering during "
            f"{describe_progress(stage, done, total)} (no heartbeat for {silent:.0f}s)",
            "Sluice retries this by itself. If workers keep dying, check their logs and memory.",
        )
        result = fail(
            session=session,
            job_id=job_id,
            lease=lease,
            error=lost,
            worker_id="reaper",
            retry=retry,
            stale_before=cutoff,
        )
        if result is not None:
            taken.append(job_id)
    return taken
