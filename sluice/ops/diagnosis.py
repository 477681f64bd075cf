"""Why a job is not moving, and when a waiting one should start: one diagnosis for the console's
job page (``sluice.console.diagnose``) and the API's job state (``waiting``, ``waiting_for``),
made by ``diagnose`` from the same ``Facts``.

The cause, first that holds: a pause (the whole queue's, or the dataset's); the queue Redis
unreachable (nobody can say who is alive); no worker alive (nothing runs, whatever else holds);
an outage the job waits out (what it waits for, when it looks again); its next attempt's backoff;
and else its turn: the jobs ahead of it in the dispatcher's order on the workers alive.

The start estimate (``starts_in``) comes from measures, never from a made-up rate: the worker
threads alive (the workers' presence keys), what each running job has left, and the mean time from
claim to success of the jobs that succeeded in the last hour (``Pace``: their attempts, as long as
they took under the load of that hour). A running job has left its own rate's worth (chunks still
to embed at the pace it embedded the ones done) or, before it counts chunks, the mean less what it
ran already. Each thread takes the next job in line once its own is done; the job starts when the
turn of its ``ahead`` jobs has come and a thread frees for it. There is no estimate without a
worker, without a queue to ask, under a pause, or when it would need a pace and none was measured.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from sluice.ops.health import QueuePosition
from sluice.pipeline.queueing import broker
from sluice.storage import queries
from sluice.storage.clock import as_utc, db_now
from sluice.storage.models import Job, JobEvent, JobStatus, Stage

PACE_WINDOW = timedelta(hours=1)  # the successes the pace stands on
MEASURE_SECONDS = 10.0  # the pace and the running jobs are read again at most this often
FLEET_SECONDS = 2.0  # the presence keys, the same (a stopping worker removes its own at once)
START_NOTE = "nothing will run until one starts (`sluice serve worker`)"


@dataclass(frozen=True)
class Fleet:
    """The workers alive, as their presence keys in the queue Redis say (``reachable`` False: the
    queue did not answer, so nobody knows)."""

    reachable: bool
    workers: int = 0
    threads: int = 0
    error: str = ""

    @property
    def note(self) -> str:
        if not self.reachable:
            return "worker count unknown (queue unreachable)"
        if not self.workers:
            return f"no worker is alive, so {START_NOTE}"
        return f"{self.workers} worker(s) alive"


@dataclass(frozen=True)
class Pace:
    """How long recent jobs took: the mean from claim to success of those that succeeded in the
    window, and how many it stands on."""

    jobs: int = 0
    seconds: float | None = None  # the mean, per job

    @classmethod
    def of(cls, finished: list[tuple]) -> Pace:
        """From (claim, success, chunks, bytes) per job (``queries.recent_attempts``)."""
        spans = [
            (as_utc(done) - as_utc(start)).total_seconds()
            for start, done, *_ in finished
            if start and done and as_utc(done) >= as_utc(start)
        ]
        return cls(len(spans), sum(spans) / len(spans) if spans else None)

    def describe(self) -> str:
        return f"{self.jobs} job(s) done in the last hour took {_span(self.seconds or 0)} each"


@dataclass(frozen=True)
class Running:
    """A running job as the estimate sees it: when its attempt was claimed, and its chunk counts
    (``embedding``: counting chunks already)."""

    claimed: datetime
    embedding: bool = False
    done: int = 0
    total: int = 0

    def left(self, now: datetime, pace: Pace) -> float | None:
        """Seconds it has left: its own pace once it counts chunks, else the mean less its time."""
        ran = max(0.0, (as_utc(now) - as_utc(self.claimed)).total_seconds())
        if self.embedding and self.done > 0 and self.total >= self.done:
            return ran * (self.total - self.done) / self.done
        if pace.seconds is None:
            return None
        return max(0.0, pace.seconds - ran)


@dataclass(frozen=True)
class Measured:
    """What the estimate stands on, read together: the fleet, the pace and the running jobs."""

    fleet: Fleet
    pace: Pace = field(default_factory=Pace)
    running: tuple[Running, ...] = ()


def starts_in(
    *, ahead: int, threads: int, running: tuple[Running, ...], pace: Pace, now: datetime
) -> timedelta | None:
    """When a job with ``ahead`` jobs before it starts (see the module's docstring), or None when
    there is no telling (no thread, or no measure where one is needed)."""
    if threads <= 0:
        return None
    free = [0.0] * max(0, threads - len(running))
    busy = sorted(running, key=lambda r: r.claimed)[: threads - len(free)]
    if ahead < len(free):  # a thread is free for it once the ones ahead took theirs
        return timedelta(0)
    lefts = [r.left(now, pace) for r in busy]
    if pace.seconds is None or any(x is None for x in lefts):
        return None
    slots = sorted(free + [x for x in lefts if x is not None])
    rounds, slot = divmod(ahead, threads)
    return timedelta(seconds=slots[slot] + rounds * pace.seconds)


@dataclass(frozen=True)
class Facts:
    """What is known of one job and the system around it; ``row`` is the job as
    ``queries.job_row`` gives it."""

    row: dict[str, Any]
    now: datetime
    measured: Measured
    ahead: int = 0
    paused: str = ""  # the pause that holds it, in words ("": none)
    position: QueuePosition | None = None  # its message in the queue (the console reads it)
    unsent: tuple[dict, ...] = ()  # its outbox rows not yet published
    published_at: datetime | None = None
    lease_seconds: float = 60.0
    redeliver_after: float = 60.0
    own_dataset: bool = False  # ahead, running and pace are those of the job's dataset alone


@dataclass(frozen=True)
class Diagnosis:
    """``reason``: paused, queue_unreachable, no_worker, outage, backoff or queue (and running,
    stalled or cancelling for a running job); ``waiting_for``: what it waits for, in a phrase;
    ``sentence``: the whole of it, for a person; ``starts_in`` and ``basis``: the estimate and
    what it stands on; ``detail``: the cause in a few words that stay the same while nothing
    changes (no "for 12 s"): the API's ``waiting.detail``, so that a poll gets its 304."""

    reason: str
    level: str  # info (waiting its turn) or warning (stalled, or nothing will run)
    waiting_for: str
    sentence: str
    ahead: int | None = None
    starts_in: timedelta | None = None
    basis: str = ""
    detail: str = ""


def diagnose(facts: Facts) -> Diagnosis | None:
    """Why the job is not moving (None for a finished job)."""
    status = facts.row["status"]
    if status == "running":
        return _running(facts)
    if status not in ("pending", "retrying"):
        return None
    fleet = facts.measured.fleet
    if facts.paused:
        return Diagnosis(
            "paused",
            "warning",
            f"a resume: {facts.paused}",
            f"Paused: {facts.paused}; it does not start until resumed (`sluice resume`); "
            f"{fleet.note}.",
            detail=facts.paused,
        )
    own = _own_state(facts)
    if facts.position is not None and not facts.position.reachable or not fleet.reachable:
        error = facts.position.error if facts.position is not None else fleet.error
        return Diagnosis(
            "queue_unreachable",
            "warning",
            "the queue Redis to answer",
            f"The queue Redis is unreachable ({error}); by the database, {own}. It is published "
            "when the queue answers again.",
            ahead=facts.ahead if status == "pending" else None,
            detail=f"the queue Redis is unreachable; by the database, {own}",
        )
    if not fleet.workers:
        return Diagnosis(
            "no_worker",
            "warning",
            "a worker: none is alive",
            # where it stands besides, which ends in "no worker is alive, so nothing will run"
            _retrying(facts).sentence if status == "retrying" else _message(facts)[1],
            ahead=facts.ahead if status == "pending" else None,
            detail=f"no worker is alive, so {START_NOTE}; {own}",
        )
    if status == "retrying":
        return _retrying(facts)
    return _pending(facts)


def _own_state(facts: Facts) -> str:
    """What the job itself waits for, whatever holds it besides."""
    row = facts.row
    if row["status"] == "retrying":
        if row.get("waiting_for"):
            return f"the job waits for {row['waiting_for']}, with no attempt spent"
        return f"attempt {row['attempt'] + 1} of {row['max_attempts']} is due {_due(facts)}"
    return f"{facts.ahead} job(s){_of_dataset(facts)} wait ahead of this one"


def _of_dataset(facts: Facts) -> str:
    return " of its dataset" if facts.own_dataset else ""


def _due(facts: Facts) -> str:
    due = _time(facts.row.get("next_attempt_at"))
    if due is not None and due > as_utc(facts.now):
        return f"in {(due - as_utc(facts.now)).total_seconds():.0f} s"
    return "now (waiting for a worker to take it)"


def _time(value: Any) -> datetime | None:
    if not value:
        return None
    return as_utc(datetime.fromisoformat(value) if isinstance(value, str) else value)


def _running(facts: Facts) -> Diagnosis:
    """Cancelling, stalled (silent past its lease), or its progress and last beat."""
    row, now = facts.row, as_utc(facts.now)
    beat = _time(row.get("heartbeat_at"))
    silent = (now - beat).total_seconds() if beat else None
    worker = row.get("worker_id")
    if row.get("cancel_requested"):
        return Diagnosis(
            "cancelling",
            "info",
            "its worker's next batch",
            "Cancel requested: the worker stops at its next batch and removes what it wrote.",
        )
    if silent is not None and silent > facts.lease_seconds:
        return Diagnosis(
            "stalled",
            "warning",
            "the reaper",
            f"Stalled: worker {worker} has not reported for {silent:.0f} s "
            f"(lease {facts.lease_seconds:.0f} s). The reaper takes the job back and retries it.",
        )
    return Diagnosis(
        "running",
        "info",
        "",
        f"Running on {worker} ({row['progress']}); last heartbeat {silent:.0f} s ago."
        if silent is not None
        else f"Running on {worker}.",
    )


def _retrying(facts: Facts) -> Diagnosis:
    """Waiting out an outage (no attempt spent), or its next attempt's backoff."""
    row, note = facts.row, facts.measured.fleet.note
    due = _time(row.get("next_attempt_at"))
    left = max(timedelta(0), due - as_utc(facts.now)) if due is not None else timedelta(0)
    if row.get("waiting_for"):
        since = _time(row.get("waiting_since"))
        waited = f" for {(as_utc(facts.now) - since).total_seconds():.0f} s" if since else ""
        return Diagnosis(
            "outage",
            "info",
            str(row["waiting_for"]),
            f"Waiting for {row['waiting_for']}{waited}: not the job's failure, no attempt is "
            f"spent. It looks again {_due(facts)} and resumes by itself; {note}.",
            starts_in=left,
            basis="when it looks again",
            detail=f"waiting for {row['waiting_for']}",
        )
    return Diagnosis(
        "backoff",
        "info",
        f"its next attempt ({row['attempt'] + 1} of {row['max_attempts']})",
        f"Retrying: attempt {row['attempt'] + 1} of {row['max_attempts']} is due {_due(facts)}; "
        f"{note}.",
        starts_in=left,
        basis="its backoff",
        detail=f"attempt {row['attempt'] + 1} of {row['max_attempts']} is due",
    )


def _pending(facts: Facts) -> Diagnosis:
    """Its turn on the workers alive: the jobs ahead, and where its message is."""
    m = facts.measured
    after = starts_in(
        ahead=facts.ahead, threads=m.fleet.threads, running=m.running, pace=m.pace, now=facts.now
    )
    free = max(0, m.fleet.threads - len(m.running))
    where = _of_dataset(facts)
    if facts.ahead < free:
        waits = "a worker thread to take it (one is free)"
    else:
        waits = f"{facts.ahead} job(s){where} ahead of it, on {m.fleet.workers} busy worker(s)"
    basis = _basis(facts, after)
    when = f" It should start in about {_span(after.total_seconds())} ({basis})." if after else ""
    if after is None and facts.ahead >= free:
        when = f" No start time: {basis}."
    level, sentence = _message(facts)
    return Diagnosis(
        "queue",
        level,
        waits,
        sentence + when,
        ahead=facts.ahead,
        starts_in=after,
        basis=basis,
        detail=f"{facts.ahead} job(s){where} start before this one",
    )


def _basis(facts: Facts, after: timedelta | None) -> str:
    """What the estimate stands on, in words (or why there is none)."""
    m = facts.measured
    where = _of_dataset(facts)
    threads = f"{m.fleet.threads} worker thread(s), {len(m.running)} job(s){where} running"
    if after is not None and after == timedelta(0):
        return f"{threads}: a thread is free"
    if m.pace.seconds is None:
        return f"no job finished in the last hour to measure the pace by; {threads}"
    return f"{m.pace.describe()}; {threads}"


def _message(facts: Facts) -> tuple[str, str]:
    """Where the job's message is: the outbox (publishing failed, or waiting its dispatch), the
    queue (its position; the console reads it), taken by a worker, or lost."""
    note, position = facts.measured.fleet.note, facts.position
    if facts.unsent:
        err = facts.unsent[-1].get("last_error")
        if err:
            return "warning", (
                f"Not on the queue yet: publishing it failed ({err}). The worker's recovery "
                "publishes it as soon as the queue answers."
            )
        return "info", (
            "Not on the queue yet: its message waits in the outbox until the next dispatch. The "
            "queue holds only a few messages per worker thread; the next go by priority, then to "
            "the dataset with the least work under way, then the oldest (`sluice run-next` moves "
            f"a job to the front); {note}."
        )
    if position is None:
        return "info", f"{facts.ahead} job(s){_of_dataset(facts)} wait ahead of this one; {note}."
    if position.beyond_scan:
        return "info", (
            f"Waiting in the queue behind more than {position.scanned:,} other jobs "
            f"({position.length:,} queued); {note}."
        )
    if position.position is None:
        since = (
            (as_utc(facts.now) - as_utc(facts.published_at)).total_seconds()
            if (facts.published_at)
            else None
        )
        if since is not None and since < facts.redeliver_after and facts.measured.fleet.workers:
            # the usual case right after a publish: a worker took the message and claims the job
            return "info", f"Handed to a worker {since:.0f} s ago; it starts in a moment; {note}."
        return "warning", (
            "Its queue message is not in the queue"
            + (f" (published {since:.0f} s ago)" if since is not None else "")
            + ": it may have been lost. The worker's recovery publishes it again once it has "
            f"been missing for {facts.redeliver_after:.0f} s (SLUICE_REDELIVER_AFTER_SECONDS)."
        )
    return "info", (
        f"Waiting in the queue: position {position.position} of {position.length}; {note}."
    )


def _span(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


# --- reading the measures -------------------------------------------------------------------------

_fleets: dict[str, tuple[float, Fleet]] = {}
_measures: dict[tuple[str, int | None], tuple[float, Pace, tuple[Running, ...]]] = {}


def fleet(instance_id: str) -> Fleet:
    """The workers of this instance alive now (read again at most every ``FLEET_SECONDS``): a
    worker of another job database on the same queue runs none of this one's jobs."""
    at, known = _fleets.get(instance_id, (float("-inf"), Fleet(False)))
    if time.monotonic() - at <= FLEET_SECONDS:
        return known
    try:
        alive = broker.workers_alive()
    except Exception as exc:  # redis.RedisError, or a bad URL
        known = Fleet(False, error=f"{type(exc).__name__}: {exc}")
    else:
        mine = [w for w in alive if w.get("instance") in (None, instance_id)]
        known = Fleet(True, len(mine), sum(max(1, int(w.get("threads") or 1)) for w in mine))
    _fleets[instance_id] = (time.monotonic(), known)
    return known


def measured(
    session: Session, engine: Engine, instance_id: str, dataset_id: int | None = None
) -> Measured:
    """The fleet, the pace and the running jobs (of one dataset, or of all), each read again at
    most every few seconds, so that a poll stays cheap."""
    key = (str(engine.url), dataset_id)
    at, pace, running = _measures.get(key, (float("-inf"), Pace(), ()))
    if time.monotonic() - at > MEASURE_SECONDS:
        since = db_now(session) - PACE_WINDOW
        pace = Pace.of(queries.recent_attempts(session=session, since=since, dataset_id=dataset_id))
        running = _running_jobs(session, dataset_id)
        _measures[key] = (time.monotonic(), pace, running)
    return Measured(fleet(instance_id), pace, running)


def _running_jobs(session: Session, dataset_id: int | None) -> tuple[Running, ...]:
    """Each running job's last claim and its chunk counts."""
    last_claim = (
        select(func.max(JobEvent.at))
        .where(JobEvent.job_id == Job.id, JobEvent.kind == "claimed")
        .correlate(Job)
        .scalar_subquery()
    )
    stmt = select(
        func.coalesce(last_claim, Job.started_at, Job.updated_at), Job.stage, Job.done, Job.total
    ).where(col(Job.status) == JobStatus.running)
    if dataset_id is not None:
        stmt = stmt.where(col(Job.dataset_id) == dataset_id)
    return tuple(
        Running(as_utc(claimed), stage == Stage.embedding, int(done or 0), int(total or 0))
        for claimed, stage, done, total in session.exec(stmt).all()
        if claimed is not None
    )
