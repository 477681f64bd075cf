"""Periodic recovery: take back stalled jobs, publish the outbox, re-publish stranded jobs, finish
dataset deletes that died halfway; and (in a thread of its own) deliver webhook events.

Together these make the job database, not the queue, the source of truth: a Redis outage, a flushed
queue or a worker killed mid-job delays jobs but never strands them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from sqlmodel import Session, col, func, select

from sluice.pipeline.queueing import webhook_delivery
from sluice.pipeline.running import dataset_deletion
from sluice.pipeline.running.cleanup import remove_partial
from sluice.pipeline.running.context import Context
from sluice.storage import jobs, outbox, tallies
from sluice.storage.clock import as_utc, db_now
from sluice.storage.models import Job, JobStatus, Outbox

Round = Callable[[Context], str]  # a round of a floor above: starts its work, returns a note

log = logging.getLogger(__name__)


@dataclass
class RecoveryReport:
    reaped: list[int] = field(default_factory=list)
    published: list[int] = field(default_factory=list)
    republished: list[int] = field(default_factory=list)
    publish_error: str | None = None
    reap_waited_seconds: float = (
        0.0  # the grace after a silence of every reaper, waited before reaping
    )
    reap_held_seconds: float = 0.0  # with a hold: how long the reaping still waits (0: not held)
    rounds: list[str] = field(default_factory=list)  # what the EXTRA_ROUNDS started
    datasets_deleted: list[str] = field(default_factory=list)  # deletes that died, finished now

    @property
    def anything(self) -> bool:
        return bool(
            self.reaped
            or self.published
            or self.republished
            or self.publish_error
            or self.reap_waited_seconds
        )


@dataclass
class ReapHold:
    """A loop's reaping held off by the grace after a silence (``jobs.reaper_tick``), kept as state
    so the round goes on to publish instead of waiting in line: the loop reaps once ``due`` (a
    ``time.monotonic`` reading) has passed, unless the fleet has a newer hold by then (another
    reaper found a later silence): then ``due`` follows that one."""

    due: float | None = None
    fleet: datetime | None = None  # the fleet's hold (``ReaperTick.hold``) that ``due`` follows

    def remaining(self) -> float:
        return 0.0 if self.due is None else max(0.0, self.due - _monotonic())


def run_once(
    ctx: Context,
    *,
    publish: Callable[[int], None],
    queued_job_ids: Callable[[], list[int]] | None = None,
    window: int = 0,
    hold: ReapHold | None = None,
    rounds: Sequence[Round] = (),
) -> RecoveryReport:
    """One round: reap, re-publish the stranded, publish the outbox (keeping at most ``window``
    messages on the queue; 0: no window). After a silence of every reaper the reaping waits a
    grace: in line for a one-shot round (``sluice recover``, the periodic task), which publishes
    what is due first; in ``hold`` for a loop that comes back. Each of ``rounds`` (a callable of
    the context returning a note, "" when it did nothing) rides on the round: the worker hands in
    those of the floors above."""
    s = ctx.settings
    report = RecoveryReport()

    def publish_due() -> None:
        sent = outbox.dispatch(engine=ctx.engine, publish=publish, window=window)
        report.published += sent.sent
        report.publish_error = sent.error or report.publish_error

    report.reaped = _reap(ctx, report, hold, before_wait=publish_due)
    if queued_job_ids is not None:
        try:
            queued = set(queued_job_ids())
        except Exception as exc:  # the queue is down: nothing can be told stranded now
            report.publish_error = f"{type(exc).__name__}: {exc}"
            queued = None
        if queued is not None:
            with Session(ctx.engine) as session:
                report.republished = outbox.redeliver_stranded(
                    session=session,
                    older_than_seconds=s.redeliver_after_seconds,
                    queued_job_ids=queued,
                )
    publish_due()
    sweep_blob_leftovers(ctx)
    fold_tallies(ctx)
    report.datasets_deleted = finish_dataset_deletes(ctx)
    report.rounds = run_extra_rounds(ctx, rounds)
    return report


class Alarm:
    """Wakes a worker's recovery loop before its round is due: a job thread of the worker that
    wrote a retry rings it, and the loop publishes the retry when it comes due (``next_due_in``),
    whatever SLUICE_RECOVERY_INTERVAL_SECONDS says; stopping the worker rings it too."""

    def __init__(self) -> None:
        self._rung = threading.Event()

    def ring(self) -> None:
        self._rung.set()

    def wait(self, timeout: float) -> bool:
        """Wait until rung or ``timeout`` seconds; True when rung. A ring that lands once this
        returned wakes the next wait."""
        rung = self._rung.wait(max(0.0, timeout))
        self._rung.clear()
        return rung


ALARM = Alarm()  # the worker process's one loop waits on it; its job threads ring it


def next_due_in(ctx: Context) -> float | None:
    """Seconds until the next outbox row not yet due comes due (None: none waits). Rows due now
    and still unsent (a paused dataset, a full window) are not counted: a claim or a resume
    publishes those, and a loop woken for them would find nothing to do."""
    with Session(ctx.engine) as session:
        now = db_now(session)
        due = session.execute(
            select(func.min(Outbox.available_at)).where(
                col(Outbox.sent_at).is_(None), Outbox.available_at > now
            )
        ).scalar()
    return None if due is None else max(0.0, (as_utc(due) - now).total_seconds())


def finish_dataset_deletes(ctx: Context) -> list[str]:
    """Finish the dataset deletes marked a while ago and not ended (their process died halfway);
    one whose jobs still run is tried again next round. Never holds the recovery of jobs."""
    try:
        done = dataset_deletion.finish_stale(ctx)
    except Exception as exc:  # Chroma down, say: the mark stays, the next round tries again
        log.warning("recovery: a dataset delete not finished: %s: %s", type(exc).__name__, exc)
        return []
    for result in done:
        log.info("recovery: %s", result.message)
    return [r.message for r in done if r.ok]


TALLY_HEAL_EVERY_SECONDS = 3600.0
_last_heal: dict[str, float] = {}


def fold_tallies(ctx: Context) -> None:
    """The counts the console reads, their deltas since the last round summed (a read sums what is
    not folded yet itself, so a failure here costs only time), and hourly (per process) compared
    with a count over the rows, counted again on any difference (``tallies.heal``); never holds
    the recovery of jobs."""
    try:
        tallies.fold(ctx.engine)
        now = _monotonic()
        if now - _last_heal.get("at", -TALLY_HEAL_EVERY_SECONDS) >= TALLY_HEAL_EVERY_SECONDS:
            _last_heal["at"] = now
            differed = tallies.heal(ctx.engine)
            if differed:
                log.warning(
                    "recovery: %d kept count(s) differed from the rows: counted again", differed
                )
    except Exception as exc:
        log.warning("recovery: counts not folded: %s: %s", type(exc).__name__, exc)


def run_extra_rounds(ctx: Context, rounds: Sequence[Round]) -> list[str]:
    """The rounds the worker hands in (the floors above's), each guarded: one that fails never
    holds the recovery of jobs."""
    notes = []
    for round_ in rounds:
        try:
            note = round_(ctx)
        except Exception as exc:
            name = getattr(round_, "__qualname__", repr(round_))
            log.warning("recovery round %s failed: %s: %s", name, type(exc).__name__, exc)
            continue
        if note:
            notes.append(note)
    return notes


BLOB_LEFTOVER_SECONDS = 24 * 3600  # a staged upload older than this is no upload in progress
BLOB_SWEEP_EVERY_SECONDS = 600.0
_last_sweep: dict[str, float] = {}


def sweep_blob_leftovers(ctx: Context) -> None:
    """Every ten minutes at most (per process): what dead uploads and removals left in the blob
    store's staging area, older than a day (``BlobStore.sweep``). A store that does not answer
    is swept another time; the recovery round goes on."""
    now = _monotonic()
    if now - _last_sweep.get("at", -BLOB_SWEEP_EVERY_SECONDS) < BLOB_SWEEP_EVERY_SECONDS:
        return
    _last_sweep["at"] = now
    try:
        swept = ctx.blobs.sweep(older_than_seconds=BLOB_LEFTOVER_SECONDS)
    except Exception as exc:
        log.warning("blob store: leftovers not swept this time (%s)", exc)
        return
    if swept.removed:
        log.info("blob store: %s", swept.describe())


def deliver_webhooks(ctx: Context) -> webhook_delivery.DeliveryReport:
    """Post the due webhook events (run by a thread of its own in each worker: a slow endpoint must
    not hold the recovery of jobs). Without a secret nothing can be signed, so nothing is sent."""
    s = ctx.settings
    if s.webhook_secret is None:
        return webhook_delivery.DeliveryReport()
    return webhook_delivery.deliver_due(
        engine=ctx.engine,
        secret=s.webhook_secret.get_secret_value(),
        timeout=s.webhook_timeout_seconds,
        max_age_seconds=s.webhook_max_age_seconds,
    )


SILENCES_IN_A_ROUND = 3  # a one-shot round that keeps finding new silences gives up the reaping


def _reap(
    ctx: Context,
    report: RecoveryReport,
    hold: ReapHold | None,
    before_wait: Callable[[], None] = lambda: None,
) -> list[int]:
    """Take back stale running jobs, but not within a grace after a silence of every reaper (the job
    database down, or no worker at all: see ``jobs.reaper_tick``): no worker could write a
    heartbeat then, so every running job looks stale right after; the live ones beat again within
    the grace. Every round ticks, also while a hold runs and after a wait in line, so a second
    silence that begins within the grace starts a grace of its own before anything is reaped.
    A one-shot round runs ``before_wait`` (it publishes what is due) before it waits in line: a
    retry due now never waits out the grace of the reaping."""
    s = ctx.settings
    for _ in range(SILENCES_IN_A_ROUND):
        with Session(ctx.engine) as session:
            tick = jobs.reaper_tick(
                session=session, silence_seconds=silence_seconds(s), grace_seconds=grace_seconds(s)
            )
        if tick is None:
            return []
        if hold is not None:
            newer = tick.wait > 0 and (hold.due is None or not _same(tick.hold, hold.fleet))
            if tick.silence or newer:
                hold.due, hold.fleet = _monotonic() + tick.wait, tick.hold
            report.reap_held_seconds = hold.remaining()
            if report.reap_held_seconds > 0:
                return []
            hold.due = None
            break
        if tick.wait <= 0 or (report.reap_waited_seconds and not tick.silence):
            break
        log.info(
            "reaper: the reapers were silent (job database down, or no worker); waiting %.0fs for "
            "the heartbeats of live workers before taking jobs back",
            tick.wait,
        )
        if not report.reap_waited_seconds:
            before_wait()
        _sleep(tick.wait)
        report.reap_waited_seconds += tick.wait
    else:
        return []
    with Session(ctx.engine, expire_on_commit=False) as session:
        taken = jobs.reap(
            session=session,
            lease_seconds=s.lease_seconds,
            base_delay=s.retry_base_seconds,
            max_delay=s.retry_max_seconds,
            fleet_hold=tick.hold,
        )
        # A job whose cancel was requested is cancelled by the reaper: what its attempt wrote goes,
        # as its own worker would have removed it.
        ended = [session.get(Job, job_id) for job_id in taken]
    for job in ended:
        if job is not None and job.status == JobStatus.cancelled:
            remove_partial(ctx, job)
    return taken


def _same(a: datetime | None, b: datetime | None) -> bool:
    """One hold of the fleet's, as two ticks read it (a driver may give it with or without zone)."""
    if a is None or b is None:
        return a is b
    return a.replace(tzinfo=None) == b.replace(tzinfo=None)


_sleep = (
    time.sleep
)  # the wait for heartbeats in a one-shot round (tests stand in a worker's beat here)
_monotonic = time.monotonic  # a held reap's clock (tests move it on)


def silence_seconds(s) -> float:
    """How long no reaper may tick before the fleet counts it as an outage: half a lease and at
    least three recovery rounds, but short enough that the heartbeats an unnoticed silence held back
    are not yet stale (two beats under the lease)."""
    wanted = max(s.lease_seconds / 2, 3 * s.recovery_interval_seconds)
    return max(min(wanted, s.lease_seconds - 2 * s.heartbeat_seconds), s.heartbeat_seconds)


def grace_seconds(s) -> float:
    """How long after a silence every reaper waits: three beats (a live worker's heartbeat thread
    tries again every beat), never more than a lease."""
    return min(s.lease_seconds, 3 * s.heartbeat_seconds)
