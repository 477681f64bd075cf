"""Why a job waits and when it starts: the API (``GET /v1/jobs/{id}``'s ``waiting`` and
``waiting_for``) and the console's job page give the same diagnosis from the same code
(``sluice.ops.diagnosis``), and the start estimate stands on measures: the workers' presence keys
in the real queue Redis, the running jobs, and how long the jobs that succeeded lately took.

Before, with no worker alive the API said "queue, 0 ahead" with a start due at once, for ever, and
``waiting_for`` stayed null, while the console said "no worker is alive"; with the workers busy the
estimate came from a chunk rate and was minutes off."""

from __future__ import annotations

import json
import time
from datetime import datetime, timedelta

import pytest
from sqlmodel import Session, select

from sluice.api import scoped
from sluice.console.diagnose import why_waiting
from sluice.ops import diagnosis
from sluice.ops.keys import ApiPrincipal
from sluice.pipeline.queueing.broker import worker_key
from sluice.pipeline.running.context import get_context
from sluice.storage import jobs, queries
from sluice.storage.clock import as_utc, db_now
from sluice.storage.db import get_engine
from sluice.storage.models import Job, JobEvent
from tests.support.helpers import make_job

pytestmark = pytest.mark.timeout(120)
EVERY = ApiPrincipal(2, "ops", "read", True, frozenset())
NOW = datetime(2026, 1, 1, 12, 0)


@pytest.fixture
def fresh_measures(monkeypatch):
    """Nothing remembered from before: each read of the fleet and the pace is a new one."""
    monkeypatch.setattr(diagnosis, "FLEET_SECONDS", -1.0)
    monkeypatch.setattr(diagnosis, "MEASURE_SECONDS", -1.0)
    monkeypatch.setattr(diagnosis, "_fleets", {})
    monkeypatch.setattr(diagnosis, "_measures", {})


def _console(engine, job_id: int) -> tuple[str, str] | None:
    """What the console's job page says of the job, from the measures it reads."""
    ctx = get_context()
    with Session(engine) as session:
        job = session.get(Job, job_id)
        measured = diagnosis.measured(session, engine, ctx.instance_id)
        ahead = scoped.diagnosis_of(session, job, None).ahead or 0
        row = queries.job_row(job)
        now = db_now(session)
    return why_waiting(
        row,
        position=None,
        workers=measured.fleet.workers,
        unsent=[],
        ahead=ahead,
        lease_seconds=ctx.settings.lease_seconds,
        now=now,
        measured=measured,
    )


def _succeeded(engine, job: Job, *, took: float, ended_ago: float) -> None:
    """Run ``job`` to success, then date its claim and finish as if it took ``took`` seconds."""
    with Session(engine) as session:
        claimed = jobs.claim(session=session, job_id=job.id, worker_id="w", lease_seconds=30)
        jobs.succeed(
            session=session,
            job_id=job.id,
            lease=claimed.job.lease,
            worker_id="w",
            built=jobs.Built(chunks=3, pages=1, embedded=3, cached=0),
        )
    _dated(engine, job.id, claimed_ago=ended_ago + took, finished_ago=ended_ago)


def _dated(engine, job_id: int, *, claimed_ago: float, finished_ago: float | None = None) -> None:
    with Session(engine) as session:
        now = db_now(session)
        for event in session.exec(
            select(JobEvent).where(JobEvent.job_id == job_id, JobEvent.kind == "claimed")
        ):
            event.at = now - timedelta(seconds=claimed_ago)
            session.add(event)
        row = session.get(Job, job_id)
        if finished_ago is not None:
            row.finished_at = now - timedelta(seconds=finished_ago)
        row.started_at = now - timedelta(seconds=claimed_ago)
        session.add(row)
        session.commit()


def test_no_worker_alive_then_busy_workers_the_api_and_the_console_agree(
    sluice_env, database_url, services, fresh_measures
):
    engine = get_engine(database_url)
    done = [make_job(engine, "team", n) for n in range(3)]
    busy = make_job(engine, "team", 10)
    for n in (11, 12):  # ahead of it
        make_job(engine, "team", n)
    waiting = make_job(engine, "team", 13)

    # three jobs took 60 s each in the last hour; one has run 20 s of its attempt on the one thread
    for n, job in enumerate(done):
        _succeeded(engine, job, took=60, ended_ago=300 + 100 * n)
    with Session(engine) as session:
        jobs.claim(session=session, job_id=busy.id, worker_id="w", lease_seconds=30)
    _dated(engine, busy.id, claimed_ago=20)

    # no worker alive: no promise of a start, and it says what it waits for
    state = scoped.job(EVERY, waiting.id)
    assert state["waiting"]["reason"] == "no_worker", state["waiting"]
    assert state["waiting"]["starts_at"] is None and state["waiting"]["ahead"] == 2
    assert state["waiting_for"] == state["waiting"]["waiting_for"] == "a worker: none is alive"
    level, sentence = _console(engine, waiting.id)
    assert level == "warning" and "no worker is alive" in sentence
    assert "no worker is alive" in state["waiting"]["detail"]

    ctx = get_context()
    queue = services.queue.client()
    presence = {"id": "w1", "instance": ctx.instance_id, "threads": 1, "seen": time.time()}
    queue.set(f"{worker_key()}:w1", json.dumps(presence), ex=60)
    other = {**presence, "id": "w2", "instance": "another-job-database", "threads": 8}
    queue.set(f"{worker_key()}:w2", json.dumps(other), ex=60)  # runs none of these jobs

    state = scoped.job(EVERY, waiting.id)
    seen = state["waiting"]
    assert seen["reason"] == "queue" and seen["ahead"] == 2, seen
    # the running job has 60 - 20 s left, then the two ahead take 60 s each on the one thread
    with Session(engine) as session:
        now = as_utc(db_now(session))
    after = (datetime.fromisoformat(seen["starts_at"]) - now).total_seconds()
    print(f"starts in {after:.0f} s (measured: 160 s, on a 15 s grid)")
    assert 155 <= after <= 160 + 15 + 5, seen
    assert "3 job(s) done in the last hour took 60 s each" in seen["basis"]
    assert "1 worker thread(s), 1 job(s) running" in seen["basis"]
    assert (
        state["waiting_for"] == seen["waiting_for"] == "2 job(s) ahead of it, on 1 busy worker(s)"
    )
    level, sentence = _console(engine, waiting.id)
    assert level == "info" and "It should start in about 3 min" in sentence, sentence

    # the worker stops: its presence key goes, and so does the promise
    queue.delete(f"{worker_key()}:w1")
    assert scoped.job(EVERY, waiting.id)["waiting"]["reason"] == "no_worker"


def test_the_estimate_from_measures():
    pace = diagnosis.Pace(4, 30.0)
    just = diagnosis.Running(NOW - timedelta(seconds=10))
    counting = diagnosis.Running(NOW - timedelta(seconds=40), embedding=True, done=20, total=30)

    def starts(ahead, threads, *running, pace=pace):
        found = diagnosis.starts_in(
            ahead=ahead, threads=threads, running=running, pace=pace, now=NOW
        )
        return None if found is None else found.total_seconds()

    assert starts(0, 0) is None  # no worker: no telling
    assert starts(1, 2) == 0 and starts(0, 2, just) == 0  # a thread is free for it
    assert starts(0, 1, just) == 20  # the mean less what it ran
    assert starts(0, 1, counting) == 20  # its own pace: 10 chunks left at 2 s each
    assert starts(1, 2, just, counting) == 20 and starts(2, 2, just, counting) == 50
    assert starts(0, 1, just, pace=diagnosis.Pace()) is None  # nothing measured to go by
