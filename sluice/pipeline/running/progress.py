"""An attempt's progress and its watchdog: the Reporter writes the stage counts (which beat the
heartbeat) at most every half second; the Heartbeat thread beats while one long call keeps the
worker busy, and ends the attempt on a lost lease, a stage deadline or a cancel it cannot see."""

from __future__ import annotations

import logging
import threading
import time

from sqlalchemy.exc import DisconnectionError, InterfaceError, OperationalError
from sqlmodel import Session

from sluice import faults
from sluice.errors import JobCancelled, LeaseLost
from sluice.pipeline.running import timeouts
from sluice.pipeline.running.cleanup import remove_partial
from sluice.pipeline.running.context import Context
from sluice.settings import Settings
from sluice.storage import jobs
from sluice.storage.models import Job, Stage

log = logging.getLogger(__name__)

PROGRESS_EVERY_SECONDS = 0.5
DATABASE_DOWN = (OperationalError, DisconnectionError, InterfaceError)
CANCEL_GRACE_SECONDS = (
    1.0  # a cancel the job's own thread has not acted on for this long: the watchdog acts
)


def retry_policy(s: Settings) -> jobs.RetryPolicy:
    """The backoff of a failed attempt's retry, as the settings give it."""
    return jobs.RetryPolicy(s.retry_base_seconds, s.retry_max_seconds)


class Heartbeat(threading.Thread):
    """Beats the job's heartbeat while a long step (one big batch) keeps the worker busy; a beat
    also writes the stage counts the reporter holds back, so a long batch shows its stage.

    It is also the attempt's watchdog: while one call (an encode, a request) does not return, only
    this thread runs. It enforces the stage deadline and carries out a cancel the stuck thread
    cannot see, each by a write fenced on the lease, so the stuck thread's later writes fail with
    LeaseLost; and when the lease is lost it tells the reporter, which stops the attempt before its
    next write.
    """

    def __init__(self, ctx: Context, job: Job, reporter: Reporter) -> None:
        super().__init__(daemon=True, name=f"heartbeat-{job.id}")
        self.ctx, self.job, self.job_id, self.lease, self.reporter = (
            ctx,
            job,
            job.id,
            job.lease,
            reporter,
        )
        self.stopped = threading.Event()
        self.lost = False

    def run(self) -> None:
        s = self.ctx.settings
        while not self.stopped.wait(s.heartbeat_seconds):
            try:
                cancel = self._beat()
            except LeaseLost:
                self._lose()
                return
            except Exception as exc:  # the database hiccuped; the next beat may get through
                log.warning("heartbeat of job %s failed: %s", self.job_id, exc)
                continue
            if self.stopped.is_set():
                return
            now = time.monotonic()
            silent = now - self.reporter.last_update
            if (
                now - self.reporter.stage_started > s.stage_timeout_seconds
                and silent > s.heartbeat_seconds
            ):
                self._stage_timeout(silent)
                return
            if cancel and silent > max(2 * s.heartbeat_seconds, CANCEL_GRACE_SECONDS):
                self._cancel(silent)
                return

    def _beat(self) -> bool:
        """Beat (or write the held counts); returns whether a cancel is requested."""
        if self.reporter.flush():
            return self.reporter.cancel
        with Session(self.ctx.engine) as session:
            if not jobs.heartbeat(session=session, job_id=self.job_id, lease=self.lease):
                raise LeaseLost(f"job {self.job_id} is no longer owned by lease {self.lease}")
            return jobs.cancel_requested(session=session, job_id=self.job_id)

    def _lose(self) -> None:
        self.lost = self.reporter.lost = True
        log.warning(
            "job %s: lease %s lost; the attempt stops before its next write",
            self.job_id,
            self.lease,
        )
        faults.hit("heartbeat_lost", job_id=self.job_id)

    def _stage_timeout(self, silent: float) -> None:
        s, stage = self.ctx.settings, self.reporter.stage
        self.reporter.lost = True  # whatever the stuck call does next is no longer this attempt's
        log.warning(
            "job %s: %s has run past SLUICE_STAGE_TIMEOUT_SECONDS with one call silent for %.0fs; "
            "ending the attempt",
            self.job_id,
            stage.value,
            silent,
        )
        kind, hint = timeouts.kind_and_hint(self.ctx.engine, self.job_id, stage)
        error = jobs.JobError(
            kind,
            timeouts.TIMEOUT_CODE,
            f"{stage.value} took longer than {s.stage_timeout_seconds:.0f}s (one call did not "
            f"return for {silent:.0f}s)",
            hint,
        )
        with Session(self.ctx.engine, expire_on_commit=False) as session:
            after = jobs.fail(
                session=session,
                job_id=self.job_id,
                lease=self.lease,
                error=error,
                worker_id=self.ctx.worker_id,
                retry=retry_policy(s),
            )
        if after is not None and after.status.value == "cancelled":
            remove_partial(self.ctx, self.job)

    def _cancel(self, silent: float) -> None:
        self.reporter.lost = True
        log.warning(
            "job %s: cancel requested while one call is silent for %.0fs; stopping it here",
            self.job_id,
            silent,
        )
        remove_partial(self.ctx, self.job)
        with Session(self.ctx.engine, expire_on_commit=False) as session:
            jobs.acknowledge_cancel(
                session=session, job_id=self.job_id, lease=self.lease, worker_id=self.ctx.worker_id
            )

    def stop(self) -> None:
        self.stopped.set()


class Reporter:
    """Holds the job's stage counts and writes them (which also beats the heartbeat) at most every
    half second, and when forced; the heartbeat thread writes what is held during one long batch.
    Raises JobCancelled when the operator asked to stop, LeaseLost when the job is no longer ours.

    A stage change alone does not force a write: a small job would otherwise pay a database write
    per stage (six, for a job that takes 20 ms); its claim and its success say all there is.
    """

    def __init__(self, ctx: Context, job_id: int, lease: int) -> None:
        self.ctx, self.job_id, self.lease = ctx, job_id, lease
        self.stage: Stage = Stage.parsing  # what the claim wrote
        self.last = time.monotonic()  # the claim counts as a write
        self.stage_started = self.last
        self.last_update = self.last  # the last step the job's own thread reported
        self.pending: dict | None = None
        self.seconds: dict[
            str, float
        ] = {}  # time spent per stage, for the success event (and metrics)
        self.cancel = False
        self.page_count: int | None = None  # once parsing counted them; a failed job keeps it
        self.blob_key: str | None = None  # the document's file as this attempt read it
        self.lost = (
            False  # set by the heartbeat: the lease is gone, or the watchdog ended the attempt
        )
        self._pending_lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._fenced = False  # the first fence writes the held counts (see ``fence``)

    def check(self) -> None:
        """LeaseLost if the attempt is no longer this thread's, as far as the heartbeat knows."""
        if self.lost:
            raise LeaseLost(f"job {self.job_id}: lease {self.lease} lost or the attempt was ended")

    def fence(self) -> None:
        """LeaseLost unless the job database says the attempt still owns the job (call right before
        a write to the vector store: a delete or a supersede may have landed since the last beat,
        and their cleanup must not be followed by one more batch). Counts held back are written
        at the attempt's first fence, by the same fenced write that proves it (a small job's only
        write between its claim and its success); otherwise the job's row is read."""
        self.check()
        if not self._fenced:
            self._fenced = True
            try:
                if self.flush():
                    return
            except LeaseLost:
                self.lost = True
                raise
        with Session(self.ctx.engine) as session:
            if not jobs.owns(session=session, job_id=self.job_id, lease=self.lease):
                self.lost = True
                raise LeaseLost(f"job {self.job_id} is no longer owned by lease {self.lease}")

    def update(self, stage: Stage, done: int, total: int, *, force: bool = False, **extra) -> None:
        self.check()
        now = self.last_update = time.monotonic()
        if stage != self.stage:
            self.seconds[self.stage.value] = (
                self.seconds.get(self.stage.value, 0.0) + now - self.stage_started
            )
            self.stage, self.stage_started = stage, now
        elif now - self.stage_started > self.ctx.settings.stage_timeout_seconds:
            # A starved host makes any document slow: retried once; a second time it is the file.
            raise timeouts.error(
                self.ctx.engine,
                self.job_id,
                stage,
                f"{stage.value} took longer than {self.ctx.settings.stage_timeout_seconds:.0f}s",
            )
        with self._pending_lock:
            self.pending = {
                **(self.pending or {}),
                **extra,
                "stage": stage,
                "done": done,
                "total": total,
            }
        if force or now - self.last >= PROGRESS_EVERY_SECONDS:
            self.flush()
        if self.cancel:
            raise JobCancelled()

    def stage_seconds(self) -> dict[str, float]:
        """Seconds per stage so far, the current one included."""
        now = time.monotonic()
        spent = {**self.seconds}
        spent[self.stage.value] = spent.get(self.stage.value, 0.0) + now - self.stage_started
        return {k: round(v, 4) for k, v in spent.items()}

    def flush(self) -> bool:
        """Write the held counts, if any; remember a cancel request. False when nothing was held."""
        with self._write_lock:
            with self._pending_lock:
                values, self.pending = self.pending, None
            if values is None:
                return False
            try:
                with Session(self.ctx.engine) as session:
                    cancel = jobs.progress(
                        session=session, job_id=self.job_id, lease=self.lease, **values
                    )
            except DATABASE_DOWN as exc:
                # Counts are not the attempt's work: a database that does not answer for a moment
                # must not end it. They are held again and written by the next flush or beat (the
                # outcome, which must be written, waits for the database:
                # _when_the_database_answers).
                with self._pending_lock:
                    self.pending = {**values, **(self.pending or {})}
                log.warning("job %s: progress not written (%s)", self.job_id, str(exc)[:200])
                return False
            self.last = time.monotonic()
            self.cancel = self.cancel or cancel
            return True
