"""The job store on SQLite and on PostgreSQL (the `database_url` fixture runs each test on both;
PostgreSQL when SLUICE_TEST_DATABASE_URL is set, in a database created and dropped per test).

Schema creation on a fresh and on an existing database, every transition of the state machine,
the outbox, claims that cannot double-claim when threads race, and one end-to-end run with a real
consumer.
"""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from sqlalchemy import inspect
from sqlmodel import Session, SQLModel, func, select

from sluice.errors import ErrorKind, LeaseLost
from sluice.storage import jobs
from sluice.storage.db import (
    DEFAULT_DATASET,
    dispose_engines,
    ensure_dataset,
    get_engine,
    init_schema,
    make_engine,
)
from sluice.storage.jobs import endings
from sluice.storage.models import Dataset, Document, Job, JobEvent, JobStatus, Outbox, Stage, utcnow
from sluice.storage.outbox import dispatch, redeliver_stranded, unsent_count
from sluice.storage.vectors import chunk_id
from tests.support.helpers import events, ids_of_job, wait_for

LEASE = 30.0


@pytest.fixture
def engine(database_url):
    return get_engine(database_url)


def new_job(engine, n: int, *, dataset: str = DEFAULT_DATASET, max_attempts: int = 3) -> int:
    sha = f"{n:064x}"
    with Session(engine, expire_on_commit=False) as session:
        ds = ensure_dataset(session=session, name=dataset)
        doc = Document(
            dataset_id=ds.id,
            sha256=sha,
            size=10,
            media_type="application/pdf",
            filename=f"doc-{n}.pdf",
            blob_key=sha,
        )
        session.add(doc)
        session.flush()
        job, created = jobs.create_job(
            session=session,
            document=doc,
            pipeline_version="vtest",
            idempotency_key=f"{ds.id}:{sha}:vtest",
            max_attempts=max_attempts,
        )
        session.commit()
        assert created
        return job.id


def get(engine, job_id: int) -> Job:
    with Session(engine) as session:
        return session.get(Job, job_id)


def kinds(engine, job_id: int) -> list[str]:
    with Session(engine) as session:
        return list(
            session.exec(
                select(JobEvent.kind).where(JobEvent.job_id == job_id).order_by(JobEvent.id)
            )
        )


def claim(engine, job_id: int, worker: str = "w1") -> jobs.ClaimResult:
    with Session(engine, expire_on_commit=False) as session:
        return jobs.claim(session=session, job_id=job_id, worker_id=worker, lease_seconds=LEASE)


def fail(engine, job_id: int, lease: int, kind: ErrorKind, code: str = "boom") -> Job | None:
    with Session(engine, expire_on_commit=False) as session:
        return jobs.fail(
            session=session,
            job_id=job_id,
            lease=lease,
            error=jobs.JobError(kind, code, f"{code} happened", "do something", "trace"),
            worker_id="w1",
            retry=jobs.RetryPolicy(base_delay=0.01, max_delay=0.02),
        )


def unsent(engine) -> int:
    with Session(engine) as session:
        return unsent_count(session=session)


def together(target, args_list: list[tuple]) -> tuple[list, list[BaseException]]:
    """Run ``target(*args)`` in one thread per args, released at the same instant by a barrier."""
    barrier = threading.Barrier(len(args_list))
    results: list = []
    errors: list[BaseException] = []

    def run(*args) -> None:
        barrier.wait()
        try:
            results.append(target(*args))
        except BaseException as exc:  # collected and asserted by the caller
            errors.append(exc)

    threads = [threading.Thread(target=run, args=args) for args in args_list]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return results, errors


# --- schema ---------------------------------------------------------------------------------------


def test_schema_on_a_fresh_and_on_an_existing_database(database_url):
    engine = get_engine(database_url)
    tables = set(inspect(engine).get_table_names())
    assert {"dataset", "document", "job", "job_event", "outbox"} <= tables
    job_id = new_job(engine, 1)
    # A second process (a new engine) starts on the existing database: nothing lost, nothing
    # doubled.
    dispose_engines()
    again = get_engine(database_url)
    init_schema(again)
    init_schema(again)
    with Session(again) as session:
        assert (
            session.exec(
                select(func.count()).select_from(Dataset).where(Dataset.name == DEFAULT_DATASET)
            ).one()
            == 1
        )
        assert session.get(Job, job_id).status == JobStatus.pending


def test_an_index_a_newer_version_defines_is_made_on_an_existing_database(database_url):
    """``create_all`` makes the indexes of new tables only; an upgraded Sluice must add its new
    ones."""
    from sqlalchemy import text

    engine = get_engine(database_url)
    new_job(engine, 1)
    with engine.begin() as conn:
        conn.execute(text("DROP INDEX ix_job_status_finished"))
    assert "ix_job_status_finished" not in {ix["name"] for ix in inspect(engine).get_indexes("job")}
    dispose_engines()
    again = get_engine(database_url)
    init_schema(again)
    assert "ix_job_status_finished" in {ix["name"] for ix in inspect(again).get_indexes("job")}
    init_schema(again)  # and a second start finds nothing to do

    # Several upgraded processes starting at once on that database all come up, with one index.
    with again.begin() as conn:
        conn.execute(text("DROP INDEX ix_job_status_finished"))
    engines = [make_engine(database_url) for _ in range(4)]
    try:
        _, errors = together(init_schema, [(e,) for e in engines])
        assert errors == []
        assert [ix["name"] for ix in inspect(engines[0]).get_indexes("job")].count(
            "ix_job_status_finished"
        ) == 1
    finally:
        for e in engines:
            e.dispose()


def test_several_processes_create_the_schema_at_once(database_url):
    """Workers and consoles starting together on an empty database all come up."""
    engines = [make_engine(database_url) for _ in range(4)]
    try:
        _, errors = together(init_schema, [(e,) for e in engines])
        assert errors == []
        with Session(engines[0]) as session:
            assert (
                len(session.exec(select(Dataset).where(Dataset.name == DEFAULT_DATASET)).all()) == 1
            )
        assert set(SQLModel.metadata.tables) <= set(inspect(engines[0]).get_table_names())
    finally:
        for e in engines:
            e.dispose()


# --- creation and claims --------------------------------------------------------------------------


def test_create_writes_job_outbox_and_event_and_is_idempotent(engine):
    job_id = new_job(engine, 1)
    job = get(engine, job_id)
    assert (job.status, job.stage, job.attempt, job.lease, job.version) == (
        JobStatus.pending,
        Stage.queued,
        0,
        0,
        0,
    )
    assert kinds(engine, job_id) == ["created"]
    assert unsent(engine) == 1
    with Session(engine, expire_on_commit=False) as session:
        doc = session.get(Document, job.document_id)
        same, created = jobs.create_job(
            session=session,
            document=doc,
            pipeline_version="vtest",
            idempotency_key=job.idempotency_key,
            max_attempts=3,
        )
        session.commit()
    assert (same.id, created) == (job_id, False)
    assert unsent(engine) == 1


def test_claim_then_second_delivery_is_a_noop(engine):
    job_id = new_job(engine, 1)
    first = claim(engine, job_id)
    assert first.claimed and first.job.status == JobStatus.running
    assert (first.job.attempt, first.job.lease, first.job.worker_id) == (1, 1, "w1")
    second = claim(engine, job_id, "w2")
    assert not second.claimed and "already running on w1" in second.reason
    assert kinds(engine, job_id) == ["created", "claimed", "noop"]


def test_racing_claims_never_double_claim(engine):
    """Threads, each with its own connection, claim the same job at the same instant: one wins."""
    racers = 6
    for n in range(8):
        job_id = new_job(engine, 100 + n)
        results, errors = together(claim, [(engine, job_id, f"w{i}") for i in range(racers)])
        assert errors == []
        winners = [r for r in results if r.claimed]
        assert len(winners) == 1, [r.reason for r in results]
        job = get(engine, job_id)
        assert (job.status, job.attempt, job.lease, job.worker_id) == (
            JobStatus.running,
            1,
            1,
            winners[0].job.worker_id,
        )
        seen = kinds(engine, job_id)
        assert seen.count("claimed") == 1 and seen.count("noop") == racers - 1


# --- the worker's side ----------------------------------------------------------------------------


def test_progress_is_fenced_by_the_lease_and_reports_cancel(engine):
    job_id = new_job(engine, 1)
    lease = claim(engine, job_id).job.lease
    with Session(engine) as session:
        assert (
            jobs.progress(
                session=session, job_id=job_id, lease=lease, stage=Stage.embedding, done=3, total=10
            )
            is False
        )
    job = get(engine, job_id)
    assert (job.stage, job.done, job.total) == (Stage.embedding, 3, 10)
    with Session(engine) as session, pytest.raises(LeaseLost):
        jobs.progress(
            session=session, job_id=job_id, lease=lease + 1, stage=Stage.embedding, done=4, total=10
        )
    with Session(engine) as session:
        assert jobs.heartbeat(session=session, job_id=job_id, lease=lease)
        assert not jobs.heartbeat(session=session, job_id=job_id, lease=lease + 1)
        assert jobs.request_cancel(session=session, job_ids=[job_id], actor="op")[0].ok
        assert (
            jobs.progress(
                session=session, job_id=job_id, lease=lease, stage=Stage.embedding, done=5, total=10
            )
            is True
        )


def test_each_progress_write_is_a_job_progress_event_of_the_log(engine):
    """The stage counts the runner writes (once per batch, at most twice a second) are events of
    the one log: the stream sends them as job.progress; a write that lost its lease leaves none."""
    from sluice.api import event_stream
    from sluice.ops import reads

    job_id = new_job(engine, 1)
    lease = claim(engine, job_id).job.lease
    for done in (32, 64):
        with Session(engine) as session:
            jobs.progress(
                session=session,
                job_id=job_id,
                lease=lease,
                stage=Stage.embedding,
                done=done,
                total=100,
            )
    with Session(engine) as session, pytest.raises(LeaseLost):
        jobs.progress(
            session=session,
            job_id=job_id,
            lease=lease + 1,
            stage=Stage.embedding,
            done=96,
            total=100,
        )
    with Session(engine) as session:
        logged = session.exec(
            select(JobEvent).where(JobEvent.job_id == job_id, JobEvent.kind == "progress")
        ).all()
    assert [(e.message, e.data, e.stage, e.attempt) for e in logged] == [
        ("embedding 32/100 chunks", {"done": 32, "total": 100}, "embedding", 1),
        ("embedding 64/100 chunks", {"done": 64, "total": 100}, "embedding", 1),
    ]
    key = _reader()
    streamed = event_stream.poll(event_stream.open_cursor(key, dataset=None, after=0))
    progress = [e for e in streamed if e.data["kind"] == "progress"]
    assert [(e.id, e.type) for e in progress] == [(e.id, "job.progress") for e in logged]
    assert progress[-1].data["message"] == "embedding 64/100 chunks"
    timeline = [e["kind"] for e in reads.job_detail(job_id).events]
    assert timeline.count("progress") == 1  # the console shows where it got to, once


def test_succeed_makes_the_job_active_and_needs_the_lease(engine):
    job_id = new_job(engine, 1)
    lease = claim(engine, job_id).job.lease
    with Session(engine) as session, pytest.raises(LeaseLost):
        jobs.succeed(
            session=session,
            job_id=job_id,
            lease=lease + 1,
            worker_id="w1",
            built=jobs.Built(chunks=4, pages=2, embedded=4, cached=0),
        )
    with Session(engine) as session:
        assert (
            jobs.succeed(
                session=session,
                job_id=job_id,
                lease=lease,
                worker_id="w1",
                built=jobs.Built(chunks=4, pages=2, embedded=3, cached=1),
            )
            == []
        )
    job = get(engine, job_id)
    assert (job.status, job.stage, job.chunk_count, job.done, job.total) == (
        JobStatus.succeeded,
        Stage.done,
        4,
        4,
        4,
    )
    with Session(engine) as session:
        assert session.get(Document, job.document_id).active_job_id == job_id
    assert not claim(engine, job_id).claimed  # a late delivery of a finished job


def test_transient_failure_retries_with_backoff_until_the_budget_is_spent(engine):
    job_id = new_job(engine, 1, max_attempts=2)
    lease = claim(engine, job_id).job.lease
    after = fail(engine, job_id, lease, ErrorKind.transient, "service_unavailable")
    assert after.status == JobStatus.retrying and after.next_attempt_at is not None
    with Session(engine) as session:
        due = session.exec(
            select(Outbox).where(Outbox.job_id == job_id).order_by(Outbox.id.desc())
        ).first()
    assert due.sent_at is None and due.available_at == after.next_attempt_at
    again = claim(engine, job_id)  # due within a second: claimable
    assert again.claimed and again.job.attempt == 2
    last = fail(engine, job_id, again.job.lease, ErrorKind.transient, "service_unavailable")
    assert last.status == JobStatus.failed
    assert last.error_message.startswith("gave up after 2 attempts")
    assert kinds(engine, job_id) == ["created", "claimed", "attempt_failed", "claimed", "failed"]


def test_permanent_failure_is_a_dead_letter_at_once_and_a_stale_lease_changes_nothing(engine):
    job_id = new_job(engine, 1)
    lease = claim(engine, job_id).job.lease
    assert fail(engine, job_id, lease + 1, ErrorKind.permanent) is None
    failed = fail(engine, job_id, lease, ErrorKind.permanent, "unreadable_pdf")
    assert (failed.status, failed.error_kind, failed.error_code) == (
        JobStatus.failed,
        ErrorKind.permanent,
        "unreadable_pdf",
    )
    assert failed.attempt == 1 and failed.finished_at is not None


def test_a_failure_is_recorded_although_its_own_heartbeat_wrote_in_between(engine, monkeypatch):
    """The worker's heartbeat thread may write progress between fail's read and its compare-and-set
    (a long parse reports every quarter second): the same lease's write must not lose the
    failure."""
    job_id = new_job(engine, 1)
    lease = claim(engine, job_id).job.lease
    read = jobs.get_job
    beaten = []

    def read_then_beat(*, session, job_id):
        job = read(session=session, job_id=job_id)
        if not beaten:
            with Session(engine) as other:
                beaten.append(
                    jobs.progress(
                        session=other,
                        job_id=job_id,
                        lease=lease,
                        stage=Stage.parsing,
                        done=1,
                        total=3,
                    )
                )
        return job

    monkeypatch.setattr(endings, "get_job", read_then_beat)  # the read that fail and cancel make
    failed = fail(engine, job_id, lease, ErrorKind.permanent, "unreadable_pdf")
    assert beaten and failed is not None
    assert (get(engine, job_id).status, get(engine, job_id).error_code) == (
        JobStatus.failed,
        "unreadable_pdf",
    )

    # the same for a cancel the worker acknowledges
    job_id = new_job(engine, 2)
    lease = claim(engine, job_id).job.lease
    with Session(engine) as session:
        jobs.request_cancel(session=session, job_ids=[job_id], actor="test")
    beaten.clear()
    with Session(engine) as session:
        done = jobs.acknowledge_cancel(session=session, job_id=job_id, lease=lease, worker_id="w1")
    assert beaten and done is not None and get(engine, job_id).status == JobStatus.cancelled


def test_retry_dismiss_and_reindex(engine):
    job_id = new_job(engine, 1)
    fail(engine, job_id, claim(engine, job_id).job.lease, ErrorKind.permanent)
    with Session(engine) as session:
        assert jobs.dismiss(session=session, job_ids=[job_id], actor="op")[0].ok
        result = jobs.retry(session=session, job_ids=[job_id], actor="op")[0]
    assert result.ok, result.message
    job = get(engine, job_id)
    assert (job.status, job.attempt, job.error_kind, job.dismissed) == (
        JobStatus.pending,
        0,
        None,
        False,
    )
    lease = claim(engine, job_id).job.lease
    with Session(engine) as session:
        jobs.succeed(
            session=session,
            job_id=job_id,
            lease=lease,
            worker_id="w1",
            built=jobs.Built(chunks=1, pages=1, embedded=1, cached=0),
        )
        refused = jobs.retry(session=session, job_ids=[job_id], actor="op")[0]
        assert not refused.ok and "reindex" in refused.message
        assert jobs.reindex(session=session, job_ids=[job_id], actor="op")[0].ok
    assert get(engine, job_id).status == JobStatus.pending
    assert kinds(engine, job_id)[-1] == "reindex_requested"


def test_cancel_pending_running_and_acknowledged(engine):
    pending, running = new_job(engine, 1), new_job(engine, 2)
    lease = claim(engine, running).job.lease
    with Session(engine) as session:
        results = jobs.request_cancel(session=session, job_ids=[pending, running], actor="op")
    assert all(r.ok for r in results)
    assert get(engine, pending).status == JobStatus.cancelled
    assert not claim(engine, pending).claimed
    assert get(engine, running).cancel_requested
    with Session(engine, expire_on_commit=False) as session:
        done = jobs.acknowledge_cancel(session=session, job_id=running, lease=lease, worker_id="w1")
    assert done.status == JobStatus.cancelled and done.error_code == "cancelled"
    # A failure reported after a cancel request ends cancelled too, not as a dead letter.
    third = new_job(engine, 3)
    lease3 = claim(engine, third).job.lease
    with Session(engine) as session:
        jobs.request_cancel(session=session, job_ids=[third], actor="op")
    assert fail(engine, third, lease3, ErrorKind.transient).status == JobStatus.cancelled


def test_reaper_takes_back_only_stale_running_jobs(engine):
    stale, fresh, waiting = new_job(engine, 1), new_job(engine, 2), new_job(engine, 3)
    claim(engine, stale)
    claim(engine, fresh)
    with Session(engine) as session:
        job = session.get(Job, stale)
        job.heartbeat_at = utcnow() - timedelta(seconds=LEASE * 2)
        session.add(job)
        session.commit()
        taken = jobs.reap(session=session, lease_seconds=LEASE, base_delay=0.01, max_delay=0.02)
    assert taken == [stale]
    reaped = get(engine, stale)
    assert (reaped.status, reaped.error_code, reaped.error_kind) == (
        JobStatus.retrying,
        "worker_lost",
        ErrorKind.transient,
    )
    assert get(engine, fresh).status == JobStatus.running
    assert get(engine, waiting).status == JobStatus.pending
    # The lost worker's late writes are refused.
    with Session(engine) as session, pytest.raises(LeaseLost):
        jobs.progress(session=session, job_id=stale, lease=1, stage=Stage.parsing, done=1, total=1)


# --- the outbox -----------------------------------------------------------------------------------


def test_outbox_publishes_in_order_and_keeps_rows_when_the_queue_is_down(engine):
    ids = [new_job(engine, n) for n in range(5)]

    def down(job_id: int) -> None:
        raise ConnectionError("queue Redis refused the connection")

    result = dispatch(engine=engine, publish=down)
    assert result.sent == [] and "ConnectionError" in result.error
    assert unsent(engine) == 5
    sent: list[int] = []
    assert dispatch(engine=engine, publish=sent.append).sent == ids
    assert sent == ids and unsent(engine) == 0
    # A cancelled job's row is dropped, not published.
    with Session(engine) as session:
        jobs.request_cancel(session=session, job_ids=[ids[0]], actor="op")
        jobs.retry(session=session, job_ids=[ids[0]], actor="op")
        jobs.request_cancel(session=session, job_ids=[ids[0]], actor="op")
    later: list[int] = []
    result = dispatch(engine=engine, publish=later.append)
    assert later == [] and result.skipped == 1


def test_concurrent_dispatchers_publish_every_row(engine, database_url):
    """Several processes dispatch at once (each worker's recovery loop, each upload).

    Each dispatcher marks the rows it takes as sent in one conditional UPDATE before publishing,
    so on SQLite and PostgreSQL alike each row goes out exactly once.
    """
    ids = [new_job(engine, n) for n in range(40)]
    published: list[int] = []
    lock = threading.Lock()

    def publish(job_id: int) -> None:
        with lock:
            published.append(job_id)

    _, errors = together(lambda: dispatch(engine=engine, publish=publish), [()] * 4)
    assert errors == []
    assert unsent(engine) == 0
    assert sorted(published) == ids, "a row was published twice, or not at all"


def test_a_stranded_job_is_published_again(engine):
    job_id = new_job(engine, 1)
    dispatch(engine=engine, publish=lambda _id: None)
    with Session(engine) as session:
        row = session.exec(select(Outbox).where(Outbox.job_id == job_id)).one()
        row.sent_at = utcnow() - timedelta(minutes=10)
        session.add(row)
        session.commit()
        assert (
            redeliver_stranded(session=session, older_than_seconds=60, queued_job_ids={job_id})
            == []
        )
        assert redeliver_stranded(session=session, older_than_seconds=60, queued_job_ids=set()) == [
            job_id
        ]
    assert unsent(engine) == 1 and kinds(engine, job_id)[-1] == "republished"


# --- end to end -----------------------------------------------------------------------------------


def test_end_to_end_with_a_real_consumer(database_url, make_ctx, start_worker, samples):
    """Upload, a real huey_consumer, parse, embed, index: the same code on either database."""
    from sluice.ops.ingest import ingest_path
    from sluice.pipeline.queueing.publishing import publish

    ctx = make_ctx()
    assert ctx.engine.dialect.name == (
        "sqlite" if database_url.startswith("sqlite") else "postgresql"
    )
    start_worker(workers=2)
    names = [
        "001-minimal-document.pdf",
        "004-pdflatex-4-pages.pdf",
        "005-libreoffice-writer-password.pdf",
    ]
    results = [ingest_path(ctx, samples / n, dataset="default", publish=publish) for n in names]
    assert all(r.accepted and r.published for r in results), results
    done = wait_for(ctx, [r.job_id for r in results], timeout=120)
    assert [j.status for j in done] == [JobStatus.succeeded, JobStatus.succeeded, JobStatus.failed]
    assert (done[2].error_kind, done[2].error_code) == (
        ErrorKind.user_action_required,
        "password_protected",
    )
    for j in done[:2]:
        with Session(ctx.engine) as session:
            sha = session.get(Document, j.document_id).sha256
        assert ids_of_job(ctx, j.id) == [
            chunk_id(sha, j.pipeline_version, i) for i in range(j.chunk_count)
        ]
        assert [e.kind for e in events(ctx, j.id)].count("claimed") == 1


# --- what the overview counts ---------------------------------------------------------------------


def test_throughput_buckets_are_counted_by_the_database_exactly_as_finish_times_fall(engine):
    """The overview's throughput is grouped in SQL: each finished job lands in the bucket its finish
    time falls in, boundaries included, on SQLite and PostgreSQL alike (checked against the plain
    rule, bucket = start + width * ((finished - start) // width))."""
    from sluice.storage.queries import throughput

    now = utcnow().replace(second=30, microsecond=250_000)
    for minutes, width in ((60, 1), (24 * 60, 60)):
        since = now - timedelta(minutes=minutes)
        start = since.replace(second=0, microsecond=0)
        step = timedelta(minutes=width)
        offsets = [
            since - start,
            step,
            step - timedelta(microseconds=1),
            step * 3 + timedelta(seconds=59.999),
            step * 5,
            now - start - timedelta(microseconds=1),
            -timedelta(seconds=1),
        ]
        rows = []  # (finished_at, status, chunks)
        for i, off in enumerate(offsets):
            rows.append((start + off, JobStatus.succeeded, 10 + i))
            rows.append((start + off, JobStatus.failed, 0))
        rows.append((start + step * 2, JobStatus.running, 99))  # not finished: never counted
        dataset = f"throughput-{width}"
        ids = [new_job(engine, 10_000 * width + i, dataset=dataset) for i in range(len(rows))]
        with Session(engine) as session:
            for job_id, (finished, status, chunks) in zip(ids, rows, strict=True):
                job = session.get(Job, job_id)
                job.finished_at, job.status, job.chunk_count = finished, status, chunks
                session.add(job)
            session.commit()

        expected: dict = {}
        for finished, status, chunks in rows:
            if finished < since or status not in (JobStatus.succeeded, JobStatus.failed):
                continue
            b = expected.setdefault(start + step * ((finished - start) // step), [0, 0, 0])
            if status == JobStatus.succeeded:
                b[0] += 1
                b[2] += chunks
            else:
                b[1] += 1
        with Session(engine) as session:
            dataset_id = session.get(Job, ids[0]).dataset_id
            got = throughput(
                session=session,
                minutes=minutes,
                now=now,
                bucket_minutes=width,
                dataset_id=dataset_id,
            )
        assert len(got) == minutes // width + 1
        counted = {
            b["minute"]: [b["succeeded"], b["failed"], b["chunks"]]
            for b in got
            if b["succeeded"] or b["failed"]
        }
        assert counted == expected, (minutes, width)
        assert (
            sum(v[0] for v in expected.values()) == len(offsets) - 1
        )  # the one before `since` is left out


def test_work_left_is_summed_by_the_database_by_the_same_rule_as_per_job(engine):
    """The drain estimate's work left comes as sums from the database (not a row per active job);
    the sums follow the per-job rule of ``drain.WorkLeft.of`` on SQLite and PostgreSQL alike."""
    from sluice.ops.drain import WorkLeft
    from sluice.storage.queries import remaining_work

    # (status, stage, done, total, document bytes)
    cases = [
        (JobStatus.pending, Stage.queued, 0, 0, 1_000),
        (JobStatus.running, Stage.parsing, 3, 9, 2_000),
        (JobStatus.running, Stage.embedding, 40, 100, 3_000),
        (JobStatus.running, Stage.embedding, 7, 0, 4_000),
        (JobStatus.running, Stage.embedding, 120, 100, 5_000),
        (JobStatus.running, Stage.indexing, 0, 64, 6_000),
        (JobStatus.retrying, Stage.chunking, 2, 5, 7_000),
        (JobStatus.succeeded, Stage.done, 9, 9, 8_000),
        (JobStatus.failed, Stage.embedding, 1, 50, 9_000),
    ]
    ids = [new_job(engine, 500 + i, dataset="drain") for i in range(len(cases))]
    with Session(engine) as session:
        for job_id, (status, stage, done, total, size) in zip(ids, cases, strict=True):
            job = session.get(Job, job_id)
            job.status, job.stage, job.done, job.total = status, stage, done, total
            session.get(Document, job.document_id).size = size
            session.add(job)
        session.commit()
        dataset_id = session.get(Job, ids[0]).dataset_id
        summed = WorkLeft(*remaining_work(session=session, dataset_id=dataset_id))
    per_job = WorkLeft.of(
        [
            (stage.value, done, total, size)
            for status, stage, done, total, size in cases
            if status in JobStatus.active()
        ]
    )
    assert (
        summed
        == per_job
        == WorkLeft(jobs=7, chunks=60, unknown_jobs=4, unknown_bytes=1_000 + 2_000 + 4_000 + 7_000)
    )


def test_a_compare_and_set_writes_the_job_row_once(engine):
    """A transition is one fenced UPDATE. The session must not write the same values a second time
    after it (unfenced, by id alone): that doubled every claim's and every success's writes."""
    from sqlalchemy import event

    job_id = new_job(engine, 1)
    writes: list[str] = []

    def seen(conn, cursor, statement, params, context, executemany):
        if statement.lstrip().upper().startswith("UPDATE JOB "):
            writes.append(" ".join(statement.split()))

    event.listen(engine, "before_cursor_execute", seen)
    try:
        claimed = claim(engine, job_id)
        assert claimed.job is not None and len(writes) == 1, writes
        writes.clear()
        with Session(engine, expire_on_commit=False) as session:
            jobs.succeed(
                session=session,
                job_id=job_id,
                lease=claimed.job.lease,
                worker_id="w1",
                built=jobs.Built(chunks=3, pages=1, embedded=3, cached=0),
            )
        assert len(writes) == 1 and "job.version = " in writes[0], (
            writes
        )  # fenced by the version it read
    finally:
        event.remove(engine, "before_cursor_execute", seen)
    done = get(engine, job_id)
    assert (done.status, done.chunk_count, done.version) == (
        JobStatus.succeeded,
        3,
        claimed.job.version + 1,
    )


def _reader():
    """A live read key of every dataset, as a stream re-checks its key on every poll."""
    from sluice.api.authentication import authenticate
    from tests.support.api_server import make_key

    key = authenticate(make_key("reader", datasets=None, scope="read"))
    assert key is not None
    return key


def test_a_hand_back_is_an_event_of_the_stream(engine):
    """A job a stopping worker gives back goes from running to pending: a stream client that saw
    it running must see it queued again (before: the stream left the hand-back out)."""
    from sluice.api import event_stream

    job_id = new_job(engine, 1)
    lease = claim(engine, job_id).job.lease
    with Session(engine) as session:
        assert jobs.hand_back(
            session=session, job_id=job_id, lease=lease, worker_id="w1", reason="worker stopping"
        )
    streamed = event_stream.poll(event_stream.open_cursor(_reader(), dataset=None, after=0))
    last = [e for e in streamed if e.data["job"]["id"] == job_id][-1]
    assert (last.type, last.data["kind"], last.data["job"]["status"]) == (
        "job.queued",
        "handed_back",
        "pending",
    )
