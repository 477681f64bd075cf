"""Interleavings of the job engine, forced with hooks and fault points, on SQLite and PostgreSQL.

Each test pins one timing window that the design says does not exist: a skewed host clock, a
heartbeat landing between the reaper's read and its write, a cancel arriving just before success,
two versions finishing out of order, two recovery loops at once, identical uploads at once.
"""

from __future__ import annotations

import sys
import threading
from datetime import timedelta

import pytest
from sqlmodel import Session, select

from sluice import faults
from sluice.errors import LeaseLost
from sluice.storage import jobs
from sluice.storage.models import Document, ErrorKind, Job, JobStatus, Outbox, utcnow
from sluice.storage.outbox import dispatch, redeliver_stranded
from tests.support.helpers import Background
from tests.test_jobstore import LEASE, claim, fail, get, kinds, new_job, unsent


@pytest.fixture
def engine(database_url):
    from sluice.storage.db import get_engine

    return get_engine(database_url)


@pytest.fixture
def host_clock(monkeypatch):
    """Set this process's own clock off by ``seconds`` (as on a host with a skewed clock)."""

    modules = [
        m
        for n, m in list(sys.modules.items())
        if n.startswith("sluice") and getattr(m, "utcnow", None) is utcnow
    ]

    def skew(seconds: float) -> None:
        def skewed():
            return utcnow() + timedelta(seconds=seconds)

        for module in modules:
            monkeypatch.setattr(module, "utcnow", skewed)

    return skew


# --- 3. one clock: the database's -----------------------------------------------------------------


def test_a_worker_whose_clock_is_behind_is_not_reaped(engine, host_clock):
    job_id = new_job(engine, 1)
    host_clock(-(LEASE + 1))  # this worker's host runs a lease and a second behind
    lease = claim(engine, job_id).job.lease
    with Session(engine) as session:
        assert jobs.heartbeat(session=session, job_id=job_id, lease=lease)
    host_clock(0)  # the reaper runs on a host with the right time
    with Session(engine) as session:
        assert (
            jobs.reap(session=session, lease_seconds=LEASE, base_delay=0.01, max_delay=0.02) == []
        )
    assert get(engine, job_id).status == JobStatus.running


def test_a_worker_whose_clock_is_behind_takes_its_due_retry(engine, host_clock):
    job_id = new_job(engine, 1)
    lease = claim(engine, job_id).job.lease
    assert (
        fail(engine, job_id, lease, ErrorKind.transient).status == JobStatus.retrying
    )  # due at once
    host_clock(-(LEASE + 1))
    again = claim(engine, job_id)
    assert again.claimed, again.reason
    assert kinds(engine, job_id) == ["created", "claimed", "attempt_failed", "claimed"]


def test_a_worker_whose_clock_is_ahead_does_not_reap_live_work(engine, host_clock):
    job_id = new_job(engine, 1)
    claim(engine, job_id)
    host_clock(LEASE + 1)
    with Session(engine) as session:
        assert (
            jobs.reap(session=session, lease_seconds=LEASE, base_delay=0.01, max_delay=0.02) == []
        )
    assert get(engine, job_id).status == JobStatus.running


# --- 2. the reaper takes back only what it saw stale ----------------------------------------------


def make_stale(engine, job_id: int) -> None:
    with Session(engine) as session:
        job = session.get(Job, job_id)
        job.heartbeat_at = job.heartbeat_at - timedelta(seconds=LEASE * 2)
        session.add(job)
        session.commit()


def reap(engine) -> list[int]:
    with Session(engine) as session:
        return jobs.reap(session=session, lease_seconds=LEASE, base_delay=0.01, max_delay=0.02)


def test_a_heartbeat_that_lands_after_the_reapers_read_keeps_the_attempt(engine):
    job_id = new_job(engine, 1)
    lease = claim(engine, job_id).job.lease
    make_stale(engine, job_id)

    def beat(job_id: int) -> None:  # the worker was only slow: its beat lands now
        with Session(engine) as session:
            assert jobs.heartbeat(session=session, job_id=job_id, lease=lease)

    with faults.hook("reap_selected", beat):
        assert reap(engine) == []
    j = get(engine, job_id)
    assert (j.status, j.lease, j.attempt) == (JobStatus.running, lease, 1)


def test_a_job_reclaimed_between_two_reaper_steps_keeps_its_new_attempt(engine):
    first, second = new_job(engine, 1), new_job(engine, 2)
    claim(engine, first)
    old_lease = claim(engine, second).job.lease
    make_stale(engine, first)
    make_stale(engine, second)

    def another_reaper_and_a_healthy_claim(job_id: int) -> None:
        if job_id != first:  # while this reaper handles the first job, the second changes hands
            return
        assert fail(engine, second, old_lease, ErrorKind.transient).status == JobStatus.retrying
        assert claim(engine, second, worker="healthy").claimed

    with faults.hook("reap_selected", another_reaper_and_a_healthy_claim):
        assert reap(engine) == [first]
    j = get(engine, second)
    assert (j.status, j.worker_id, j.lease) == (JobStatus.running, "healthy", old_lease + 1)


# --- 4. a cancel that arrives before success wins -------------------------------------------------

TEXT = "".join(
    f"Paragraph {i} of the survey describes the lighthouse number {i} in its own words. " * 10
    + "\n\n"
    for i in range(12)
).encode()


def test_a_cancel_requested_after_indexing_but_before_success_wins(database_url, make_ctx):
    from sluice.ops.ingest import ingest_bytes
    from sluice.pipeline.running.runner import run_job
    from tests.support.helpers import ids_of_job

    ctx = make_ctx(SLUICE_EMBED_BATCH_SIZE="4")
    r = ingest_bytes(ctx, TEXT, dataset="default", filename="survey.txt")
    written: list[int] = []

    def operator_cancels(**_) -> None:
        written.append(len(ids_of_job(ctx, r.job_id)))
        with Session(ctx.engine) as session:
            [res] = jobs.request_cancel(session=session, job_ids=[r.job_id], actor="op")
        assert res.ok and "next batch" in res.message

    with faults.hook("after_index", operator_cancels):
        outcome = run_job(r.job_id, ctx=ctx)

    j = get(ctx.engine, r.job_id)
    assert written and written[0] > 4  # every chunk was in the index when the cancel came
    assert (outcome.result, j.status) == ("cancelled", JobStatus.cancelled)
    assert not j.cancel_requested and j.error_code == "cancelled"
    assert ids_of_job(ctx, r.job_id) == []
    assert "succeeded" not in kinds(ctx.engine, r.job_id)


# --- 5. search never flips back to an older version -----------------------------------------------


def version_job(engine, job_id: int, version: str) -> int:
    """A job of another pipeline version for the document of ``job_id``."""
    with Session(engine, expire_on_commit=False) as session:
        doc = session.get(Document, get(engine, job_id).document_id)
        job, created = jobs.create_job(
            session=session,
            document=doc,
            pipeline_version=version,
            idempotency_key=f"{doc.dataset_id}:{doc.sha256}:{version}",
            max_attempts=3,
        )
        session.commit()
        assert created
        return job.id


def succeed(engine, job_id: int, lease: int):
    with Session(engine) as session:
        return jobs.succeed(
            session=session,
            job_id=job_id,
            lease=lease,
            worker_id="w",
            built=jobs.Built(chunks=2, pages=1, embedded=2, cached=0),
        )


def active(engine, job_id: int) -> int:
    with Session(engine) as session:
        return session.get(Document, get(engine, job_id).document_id).active_job_id


def test_an_old_version_still_running_when_the_new_one_succeeds_never_takes_search_back(engine):
    old = new_job(engine, 1)  # an old worker is building the old version
    old_lease = claim(engine, old, worker="old-worker").job.lease
    new = version_job(engine, old, "vnew")
    assert succeed(engine, new, claim(engine, new, worker="new-worker").job.lease) == [old]
    assert active(engine, new) == new and get(engine, old).status == JobStatus.superseded

    with pytest.raises(LeaseLost):  # the old worker finishes later: too late
        succeed(engine, old, old_lease)
    assert active(engine, new) == new
    assert (get(engine, new).status, get(engine, old).status) == (
        JobStatus.succeeded,
        JobStatus.superseded,
    )


def test_a_supersede_that_loses_its_compare_and_set_is_not_ignored(engine):
    old = new_job(engine, 1)
    assert succeed(engine, old, claim(engine, old).job.lease) == []
    new = version_job(engine, old, "vnew")
    new_lease = claim(engine, new).job.lease

    def reindex_the_old_one_meanwhile(**_) -> None:
        if get(engine, old).status == JobStatus.succeeded:  # once, between the read and the write
            with Session(engine) as session:
                assert jobs.reindex(session=session, job_ids=[old], actor="op")[0].ok

    with faults.hook("before_supersede", reindex_the_old_one_meanwhile):
        assert succeed(engine, new, new_lease) == [old]
    assert active(engine, new) == new
    assert get(engine, old).status == JobStatus.superseded  # not left pending, to win later


# --- 6. two recovery loops publish a stranded job once --------------------------------------------


def test_two_recovery_loops_that_both_find_a_stranded_job_publish_it_once(engine):
    job_id = new_job(engine, 1)
    dispatch(engine=engine, publish=lambda _id: None)
    with Session(engine) as session:
        row = session.exec(select(Outbox).where(Outbox.job_id == job_id)).one()
        row.sent_at = row.sent_at - timedelta(minutes=10)
        session.add(row)
        session.commit()
    both_selected = threading.Barrier(2, timeout=20)

    def redeliver() -> list[int]:
        with Session(engine) as session:
            return redeliver_stranded(session=session, older_than_seconds=60, queued_job_ids=set())

    with faults.hook("redeliver_selected", lambda **_: both_selected.wait()):
        loops = [Background(redeliver, name=f"recovery-{n}") for n in range(2)]
        for loop in loops:
            loop.start()
        found = sorted(loop.result(60) for loop in loops)

    assert found == [[], [job_id]]
    assert unsent(engine) == 1 and kinds(engine, job_id).count("republished") == 1
    sent: list[int] = []
    dispatch(engine=engine, publish=sent.append)
    assert sent == [job_id]


def test_a_job_publishes_through_one_waiting_outbox_row(engine):
    job_id = new_job(engine, 1)  # its first row waits, unsent
    with Session(engine) as session:
        assert jobs.request_cancel(session=session, job_ids=[job_id], actor="op")[0].ok
        assert jobs.retry(session=session, job_ids=[job_id], actor="op")[0].ok
    assert unsent(engine) == 1
    sent: list[int] = []
    dispatch(engine=engine, publish=sent.append)
    assert sent == [job_id]


# --- 7. identical uploads at the same moment ------------------------------------------------------


def test_three_identical_uploads_at_once_all_get_the_one_job(database_url, make_ctx):
    from sluice.ops.ingest import ingest_bytes

    ctx = make_ctx()
    all_looked = threading.Barrier(3, timeout=20)  # each found no document before any adds one

    with faults.hook("before_document_insert", lambda **_: all_looked.wait()):
        uploads = [
            Background(
                lambda: ingest_bytes(ctx, TEXT, dataset="default", filename="same.txt"),
                name=f"upload-{n}",
            )
            for n in range(3)
        ]
        for upload in uploads:
            upload.start()
        results = [upload.result(60) for upload in uploads]

    assert all(r.accepted for r in results)
    assert len({r.job_id for r in results}) == 1 and len({r.document_id for r in results}) == 1
    assert sorted(r.duplicate for r in results) == [False, True, True]
    assert kinds(ctx.engine, results[0].job_id) == ["created"]


def test_an_existing_database_gets_the_columns_a_newer_sluice_added(engine):
    from sqlalchemy import inspect, text

    from sluice.storage.db import add_missing_columns

    with engine.begin() as conn:  # a job table made before waiting_for existed
        conn.execute(text("ALTER TABLE job DROP COLUMN waiting_for"))
        conn.execute(text("ALTER TABLE job DROP COLUMN waiting_since"))
    assert sorted(add_missing_columns(engine)) == ["job.waiting_for", "job.waiting_since"]
    assert {"waiting_for", "waiting_since"} <= {
        c["name"] for c in inspect(engine).get_columns("job")
    }
    assert add_missing_columns(engine) == []
    job_id = new_job(engine, 1)
    assert claim(engine, job_id).claimed


# --- 1. repair never deletes what a job may claim; success is judged on the index at the end ------


def half_written(ctx):
    """A job whose first attempt wrote some of its chunks and failed (a permanent error: a dead
    letter)."""
    from sluice.ops.ingest import ingest_bytes
    from sluice.pipeline.running.runner import run_job
    from tests.support.helpers import ids_of_job

    r = ingest_bytes(ctx, TEXT, dataset="default", filename="survey.txt")
    with faults.hook("embed_batch", _fail_at(3)):
        assert run_job(r.job_id, ctx=ctx).result == "failed"
    written = ids_of_job(ctx, r.job_id)
    assert len(written) == 6
    return r.job_id, written


def _fail_at(n: int):
    calls = []

    def hook(**_) -> None:
        calls.append(1)
        if len(calls) == n:
            from sluice.errors import PermanentError

            raise PermanentError("injected_fault", "injected at the third batch", "")

    return hook


def test_a_retry_that_lands_between_the_repairs_snapshot_and_its_delete_keeps_every_chunk(
    database_url, make_ctx
):
    from sluice.pipeline.reconcile.audit import reconcile
    from sluice.pipeline.running.runner import run_job
    from tests.support.helpers import ids_of_job

    ctx = make_ctx(SLUICE_EMBED_BATCH_SIZE="2")
    job_id, written = half_written(ctx)

    def operator_retries_and_the_job_runs(ids, **_) -> None:
        assert set(written) <= set(ids)  # the repair is about to delete the first attempt's chunks
        with Session(ctx.engine) as session:
            assert jobs.retry(session=session, job_ids=[job_id], actor="op")[0].ok
        assert run_job(job_id, ctx=ctx).result == "succeeded"

    with faults.hook("reconcile_before_delete", operator_retries_and_the_job_runs):
        reconcile(ctx, repair=True, actor="test")

    j = get(ctx.engine, job_id)
    assert j.status == JobStatus.succeeded
    assert len(ids_of_job(ctx, job_id)) == j.chunk_count  # search misses nothing
    assert reconcile(ctx).clean


def test_chunks_deleted_before_the_final_check_are_written_again_not_a_dead_letter(
    database_url, make_ctx
):
    from sluice.pipeline.running.runner import run_job
    from tests.support.helpers import collection, ids_of_job

    ctx = make_ctx(SLUICE_EMBED_BATCH_SIZE="2")
    job_id, written = half_written(ctx)
    with Session(ctx.engine) as session:
        assert jobs.retry(session=session, job_ids=[job_id], actor="op")[0].ok

    def a_repair_deletes_them_now(**_) -> None:
        ctx.vectors.delete(collection(ctx), ids=written)

    with faults.hook("before_verify", a_repair_deletes_them_now):
        outcome = run_job(job_id, ctx=ctx)

    j = get(ctx.engine, job_id)
    assert (outcome.result, j.status) == ("succeeded", JobStatus.succeeded), j.error_message
    assert len(ids_of_job(ctx, job_id)) == j.chunk_count


def test_a_job_that_runs_while_the_repairs_delete_is_in_flight_is_rebuilt(database_url, make_ctx):
    from sluice.pipeline.reconcile.audit import reconcile
    from sluice.pipeline.running.runner import run_job
    from tests.support.helpers import ids_of_job

    ctx = make_ctx(SLUICE_EMBED_BATCH_SIZE="2")
    job_id, written = half_written(ctx)
    store = ctx.vectors

    class SlowDelete:
        """The delete request is under way while the operator retries and the job runs to
        success."""

        def delete(self, name, *, ids=None, where=None):
            if ids is not None and set(written) <= set(ids):
                with Session(ctx.engine) as session:
                    assert jobs.retry(session=session, job_ids=[job_id], actor="op")[0].ok
                ctx.__dict__["vectors"] = store
                assert run_job(job_id, ctx=ctx).result == "succeeded"  # it counted on the 6 ids
            return store.delete(name, ids=ids, where=where)

        def __getattr__(self, name):
            return getattr(store, name)

    ctx.__dict__["vectors"] = SlowDelete()
    report = reconcile(ctx, repair=True, actor="test")
    ctx.__dict__["vectors"] = store

    assert report.queued == [job_id], (
        report.describe()
    )  # it found what the delete took from a serving job
    assert run_job(job_id, ctx=ctx).result == "succeeded"
    j = get(ctx.engine, job_id)
    assert len(ids_of_job(ctx, job_id)) == j.chunk_count
    assert reconcile(ctx).clean


# --- 9. hangs that the heartbeat notices ----------------------------------------------------------


class StuckEmbedder:
    """The hash embedder, but its ``stuck_at``-th call blocks until released (an encode that never
    returns, as far as the job can tell)."""

    def __init__(self, stuck_at: int) -> None:
        from sluice.pipeline.running.embed import HashEmbedder

        self.inner = HashEmbedder()
        self.model_id, self.dim, self.precision = (
            self.inner.model_id,
            self.inner.dim,
            self.inner.precision,
        )
        self.stuck_at, self.calls = stuck_at, 0
        self.entered, self.release = threading.Event(), threading.Event()

    def encode(self, texts):
        self.calls += 1
        if self.calls == self.stuck_at:
            self.entered.set()
            assert self.release.wait(60), "never released"
        return self.inner.encode(texts)


def wait_status(engine, job_id: int, statuses, timeout: float = 30.0) -> Job:
    import time

    deadline = time.monotonic() + timeout
    while True:
        j = get(engine, job_id)
        if j.status in statuses:
            return j
        assert time.monotonic() < deadline, (
            f"job {job_id} still {j.status.value} ({j.stage.value}) after {timeout}s"
        )
        time.sleep(0.05)


def stuck_run(make_ctx, **env):
    from sluice.ops.ingest import ingest_bytes
    from sluice.pipeline.running.runner import run_job

    stuck = StuckEmbedder(stuck_at=2)
    ctx = make_ctx(
        embedder=stuck, SLUICE_EMBED_BATCH_SIZE="2", SLUICE_HEARTBEAT_SECONDS="0.1", **env
    )
    from tests.support.helpers import collection

    ctx.vectors.collection(
        collection(ctx)
    )  # connect first: a cold client is slower than the deadline
    r = ingest_bytes(ctx, TEXT, dataset="default", filename="survey.txt")
    runner = Background(lambda: run_job(r.job_id, ctx=ctx), name="runner")
    runner.start()
    if not stuck.entered.wait(30):
        runner.check()
        raise AssertionError(f"the encode was not reached: {get(ctx.engine, r.job_id)}")
    return ctx, r.job_id, stuck, runner


def test_an_encode_that_never_returns_still_meets_the_stage_deadline(database_url, make_ctx):
    from tests.support.helpers import ids_of_job

    ctx, job_id, stuck, runner = stuck_run(make_ctx, SLUICE_STAGE_TIMEOUT_SECONDS="2")
    try:
        j = wait_status(ctx.engine, job_id, {JobStatus.retrying, JobStatus.failed})
    finally:
        stuck.release.set()
    assert (j.status, j.error_code, j.error_kind) == (
        JobStatus.retrying,
        "stage_timeout",
        ErrorKind.transient,
    )
    assert "embedding took longer than" in j.error_message
    assert runner.result(30).result == "lost"  # the stuck thread's later writes are refused
    assert len(ids_of_job(ctx, job_id)) == 2  # and it added nothing after it came back
    assert get(ctx.engine, job_id).status == JobStatus.retrying


def test_a_cancel_during_an_encode_that_never_returns_is_carried_out(database_url, make_ctx):
    from tests.support.helpers import ids_of_job

    ctx, job_id, stuck, runner = stuck_run(make_ctx)
    assert len(ids_of_job(ctx, job_id)) == 2  # the first batch is in
    with Session(ctx.engine) as session:
        assert jobs.request_cancel(session=session, job_ids=[job_id], actor="op")[0].ok
    try:
        j = wait_status(ctx.engine, job_id, {JobStatus.cancelled})
    finally:
        stuck.release.set()
    assert j.error_message.startswith("cancelled at embedding")
    assert ids_of_job(ctx, job_id) == []
    assert runner.result(30).result == "lost"
    assert ids_of_job(ctx, job_id) == []


def test_a_lease_lost_during_a_stuck_call_stops_the_attempt_before_it_writes(
    database_url, make_ctx
):
    from tests.support.helpers import ids_of_job

    noticed = threading.Event()
    with faults.hook("heartbeat_lost", lambda **_: noticed.set()):
        ctx, job_id, stuck, runner = stuck_run(make_ctx)
        with Session(ctx.engine) as session:  # the document is deleted while the call hangs
            assert all(
                r.ok
                for r in jobs.mark_deleted(
                    session=session, document_id=get(ctx.engine, job_id).document_id, actor="op"
                )
            )
        try:
            assert noticed.wait(30), "the heartbeat never noticed it lost the job"
        finally:
            stuck.release.set()
        assert runner.result(30).result == "lost"
    assert len(ids_of_job(ctx, job_id)) == 2  # nothing written after the lease was lost


# --- 8. an outage of the job database -------------------------------------------------------------


def test_after_the_database_was_down_the_reaper_waits_for_live_heartbeats_then_takes_dead_jobs(
    database_url, make_ctx, monkeypatch
):
    """No worker can write a heartbeat while the job database is down, so right after it every
    running job looks stale. The reapers keep a shared tick in the database: after a silence of all
    of them, a reaper waits a grace (a few beats) before it takes jobs back. That holds for a reaper
    that never saw the outage itself (its loop slept through it, or it started after) -- here, the
    only one there is. A job whose worker lives beats during the grace and stays; a dead one is
    taken back in the same round, so a reaper that always comes after a silence (``sluice recover``
    with no worker up) still reaps."""
    from datetime import timedelta

    from sqlalchemy import update

    from sluice.pipeline.queueing import recovery
    from sluice.storage.models import Instance

    ctx = make_ctx()
    assert (
        recovery.run_once(ctx, publish=lambda _id: None).reaped == []
    )  # a tick: the database answers
    alive, dead = new_job(ctx.engine, 1), new_job(ctx.engine, 2)
    for job_id in (alive, dead):
        claim(ctx.engine, job_id)
        make_stale(ctx.engine, job_id)  # no heartbeat could land while it was down ...

    def silence() -> (
        None
    ):  # ... and no reaper could tick: the last tick moves back, as time passing would
        with Session(ctx.engine) as session:
            tick = session.exec(select(Instance)).one().reaper_tick_at
            session.execute(
                update(Instance).values(
                    reaper_tick_at=tick
                    - timedelta(seconds=recovery.silence_seconds(ctx.settings) + 1)
                )
            )
            session.commit()

    waits: list[float] = []

    def the_live_worker_beats(seconds: float) -> None:
        waits.append(seconds)
        with Session(ctx.engine) as session:
            assert jobs.heartbeat(session=session, job_id=alive, lease=get(ctx.engine, alive).lease)

    monkeypatch.setattr(recovery, "_sleep", the_live_worker_beats)
    silence()
    assert recovery.run_once(ctx, publish=lambda _id: None).reaped == [dead]
    assert get(ctx.engine, alive).status == JobStatus.running
    assert len(waits) == 1 and 0 < waits[0] <= recovery.grace_seconds(ctx.settings)

    # Every round after a silence (an operator's `sluice recover`, no worker up) still reaps.
    make_stale(ctx.engine, alive)
    monkeypatch.setattr(recovery, "_sleep", waits.append)
    silence()
    assert recovery.run_once(ctx, publish=lambda _id: None).reaped == [alive]
    assert len(waits) == 2
    assert recovery.run_once(ctx, publish=lambda _id: None).reaped == []  # nothing stale is left


def test_a_loops_grace_after_a_silence_holds_the_reaping_but_not_the_outbox(
    database_url, make_ctx, monkeypatch
):
    """A worker's recovery loop keeps the grace after a silence as state: the round goes on to
    publish the outbox at once (no wait in line), and a later round reaps once the grace is over,
    without a new tick moving it on. A job whose worker beats meanwhile stays."""
    from datetime import timedelta

    from sqlalchemy import update

    from sluice.pipeline.queueing import recovery
    from sluice.storage.models import Instance

    ctx = make_ctx()
    assert (
        recovery.run_once(ctx, publish=lambda _id: None).reaped == []
    )  # a tick: the database answers
    alive, dead = new_job(ctx.engine, 1), new_job(ctx.engine, 2)
    for job_id in (alive, dead):
        claim(ctx.engine, job_id)
        make_stale(ctx.engine, job_id)
    waiting = new_job(ctx.engine, 3)  # its outbox row is due
    with Session(ctx.engine) as session:
        tick = session.exec(select(Instance)).one().reaper_tick_at
        session.execute(
            update(Instance).values(
                reaper_tick_at=tick - timedelta(seconds=recovery.silence_seconds(ctx.settings) + 1)
            )
        )
        session.commit()

    def no_wait_in_line(seconds: float) -> None:
        raise AssertionError(f"the loop's round waited {seconds}s in line")

    clock = [1000.0]
    monkeypatch.setattr(recovery, "_sleep", no_wait_in_line)
    monkeypatch.setattr(recovery, "_monotonic", lambda: clock[0])
    hold, published = recovery.ReapHold(), []

    report = recovery.run_once(ctx, publish=published.append, hold=hold)
    assert report.reaped == [] and waiting in published
    assert 0 < report.reap_held_seconds <= recovery.grace_seconds(ctx.settings)
    assert hold.remaining() == report.reap_held_seconds

    clock[0] += report.reap_held_seconds / 2  # a round within the grace: still held
    assert recovery.run_once(ctx, publish=published.append, hold=hold).reaped == []
    with Session(ctx.engine) as session:  # the live worker's beat lands within the grace
        assert jobs.heartbeat(session=session, job_id=alive, lease=get(ctx.engine, alive).lease)

    clock[0] += report.reap_held_seconds  # the grace is over: this round reaps
    done = recovery.run_once(ctx, publish=published.append, hold=hold)
    assert done.reaped == [dead] and hold.due is None and done.reap_held_seconds == 0
    assert get(ctx.engine, alive).status == JobStatus.running


def test_a_silence_short_enough_to_go_unnoticed_never_makes_a_heartbeat_stale(make_ctx):
    """Whatever the settings, a silence shorter than the one that counts as an outage cannot age a
    live heartbeat past the lease (two beats to spare); the wait never exceeds a lease."""
    from sluice.pipeline.queueing import recovery

    for lease, beat, interval in ((60, 5, 5), (30, 5, 10), (10, 2, 30), (2, 0.2, 0.5)):
        s = make_ctx(
            SLUICE_LEASE_SECONDS=str(lease),
            SLUICE_HEARTBEAT_SECONDS=str(beat),
            SLUICE_RECOVERY_INTERVAL_SECONDS=str(interval),
        ).settings
        assert (
            recovery.silence_seconds(s) + 2 * beat <= lease or recovery.silence_seconds(s) == beat
        )
        assert 0 < recovery.grace_seconds(s) <= lease


def test_an_attempts_outcome_waits_for_the_database_to_answer(database_url, make_ctx, monkeypatch):
    from sqlalchemy.exc import OperationalError

    from sluice.ops.ingest import ingest_bytes
    from sluice.pipeline.running.runner import run_job

    ctx = make_ctx()
    r = ingest_bytes(ctx, TEXT, dataset="default", filename="survey.txt")
    real, calls = jobs.fail, []

    def database_down_twice(**kw):
        calls.append(1)
        if len(calls) <= 2:
            raise OperationalError("UPDATE job ...", {}, ConnectionError("connection refused"))
        return real(**kw)

    monkeypatch.setattr(jobs, "fail", database_down_twice)
    monkeypatch.setenv("SLUICE_FAULTS", "after_parse=transient")
    outcome = run_job(r.job_id, ctx=ctx)

    assert outcome.result == "retrying" and len(calls) == 3
    j = get(ctx.engine, r.job_id)
    assert (j.status, j.error_code) == (JobStatus.retrying, "injected_fault")


def test_a_failure_is_recorded_even_when_the_jobs_own_heartbeat_lands_first(engine):
    job_id = new_job(engine, 1)
    lease = claim(engine, job_id).job.lease
    beats = []

    def own_heartbeat(**_) -> None:
        if not beats:
            with Session(engine) as session:
                beats.append(jobs.heartbeat(session=session, job_id=job_id, lease=lease))

    with faults.hook("before_fail_write", own_heartbeat):
        after = fail(engine, job_id, lease, ErrorKind.transient)
    assert beats == [True]
    assert after is not None and after.status == JobStatus.retrying
