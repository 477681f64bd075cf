"""The dispatcher's choice at any backlog: every claim of a worker dispatches (the next message of
the fairness window goes out), so what a dispatch reads must not grow with the jobs waiting. The
heads of each dataset are read from indexes (``outbox.heads``); they are the rows the ranking of
every due row (the code before) put first, in the same order, with priorities, rows not yet due,
paused datasets and rows written before the outbox knew its dataset."""

from __future__ import annotations

import random
from collections import defaultdict
from datetime import timedelta

import pytest
from sqlalchemy import func, or_
from sqlalchemy import select as sql_select
from sqlmodel import Session, col

from sluice.storage import outbox
from sluice.storage.clock import db_now
from sluice.storage.db import get_engine
from sluice.storage.models import Dataset, Document, Job, JobStatus, Outbox, Pause


def _fill(
    session: Session, dataset: Dataset, n: int, *, rng: random.Random | None = None, now=None
) -> None:
    """``n`` waiting jobs of ``dataset`` with an unsent outbox row each; with ``rng``, some with a
    priority of their own, some not due yet, some already sent, some without the row's dataset."""
    for _ in range(n):
        key = f"{dataset.id}-{session.info.setdefault('made', 0)}"
        session.info["made"] += 1
        doc = Document(
            dataset_id=dataset.id,
            filename=f"{key}.txt",
            sha256=key,
            size=1,
            media_type="text/plain",
            blob_key=key,
        )
        session.add(doc)
        session.flush()
        job = Job(
            dataset_id=dataset.id,
            document_id=doc.id,
            filename=doc.filename,
            idempotency_key=key,
            pipeline_version="v",
            status=JobStatus.pending,
        )
        session.add(job)
        session.flush()
        row = Outbox(job_id=job.id, dataset_id=dataset.id, available_at=now)
        if rng is not None:
            if rng.random() < 0.15:
                job.priority = rng.choice([-1, 1, 5])
            if rng.random() < 0.15:
                row.available_at = now + timedelta(hours=1)
            if rng.random() < 0.15:
                row.sent_at = now
            if rng.random() < 0.1:
                row.dataset_id = None
        session.add(row)
    session.flush()


def _ranked_in_sql(session: Session, now, room: int) -> dict[int, list[int]]:
    """The code before: every due row ranked in its dataset by priority then row id; the first
    ``room`` of each dataset, in order."""
    rank = func.row_number().over(
        partition_by=col(Job.dataset_id), order_by=(outbox._priority().desc(), col(Outbox.id))
    )
    ranked = (
        sql_select(col(Outbox.id).label("row_id"), col(Job.dataset_id), rank.label("rank"))
        .join(Job, col(Job.id) == Outbox.job_id)
        .join(Dataset, col(Dataset.id) == Job.dataset_id)
        .where(*outbox._due(now))
        .subquery()
    )
    out: dict[int, list[int]] = {}
    for row in session.execute(
        sql_select(ranked).where(ranked.c.rank <= room).order_by(ranked.c.rank)
    ).all():
        out.setdefault(row.dataset_id, []).append(row.row_id)
    return out


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_heads_are_the_rows_the_full_ranking_puts_first(database_url, seed):
    rng = random.Random(seed)
    engine = get_engine(database_url)
    with Session(engine) as session:
        now = db_now(session)
        datasets = [
            Dataset(name=f"heads-{seed}-{i}", collection=f"heads_{seed}_{i}", priority=p)
            for i, p in enumerate([None, 2, None, -1, None])
        ]
        session.add_all(datasets)
        session.flush()
        for ds in datasets:
            _fill(session, ds, rng.randint(0, 40), rng=rng, now=now)
        session.add(
            Pause(scope=f"dataset:{datasets[2].id}", dataset_id=datasets[2].id, paused_by="t")
        )
        session.commit()
        for room in (1, 2, 3, 7, 50):
            expected = _ranked_in_sql(session, now, room)
            got: dict[int, list[int]] = {}
            for head in outbox.heads(session=session, now=now, room=room):
                got.setdefault(head.dataset_id, []).append(head.row_id)
            assert got == expected, f"room {room}"
        assert datasets[2].id not in got  # paused
        session.add(Pause(scope="all", dataset_id=None, paused_by="t"))
        session.commit()
        assert outbox.heads(session=session, now=now, room=5) == []


def _steps_of_a_choice(engine, waiting: int) -> int:
    """SQLite virtual-machine steps of one ``choose`` with ``waiting`` rows waiting in one dataset
    and 3 in another, the count of jobs in flight and running included (``load_by_dataset``)."""
    with Session(engine) as session:
        now = db_now(session)
        big = Dataset(name=f"big-{waiting}", collection=f"big_{waiting}")
        small = Dataset(name=f"small-{waiting}", collection=f"small_{waiting}")
        session.add_all([big, small])
        session.flush()
        _fill(session, big, waiting, now=now)
        _fill(session, small, 3, now=now)
        session.commit()
        order = [big.id, small.id]
    with engine.connect() as conn:
        steps = [0]

        def count() -> int:
            steps[0] += 1
            return 0

        raw = conn.connection.dbapi_connection
        raw.set_progress_handler(count, 10)
        try:
            with Session(bind=conn) as session:
                now = db_now(session)
                chosen = outbox.choose(session=session, now=now, limit=1000, window=2)
        finally:
            raw.set_progress_handler(None, 10)
    with Session(engine) as session:
        turns = [session.get(Job, job_id).dataset_id for _, job_id, _ in chosen]
    assert turns == order  # the oldest head first, then the other dataset's turn
    return steps[0]


def test_a_choice_reads_as_much_at_4000_waiting_as_at_200(tmp_path):
    """Counted in SQLite's virtual-machine steps, not timed. Before: the ranking of every due row,
    about 20 times the work at 20 times the rows; then the count of jobs in flight, which read
    every waiting job (issue 43: it reads the rows marked in flight)."""
    few = _steps_of_a_choice(get_engine(f"sqlite:///{tmp_path / 'few.db'}"), 200)
    many = _steps_of_a_choice(get_engine(f"sqlite:///{tmp_path / 'many.db'}"), 4000)
    assert many < 2 * few, (few, many)


def _load_as_before(session: Session) -> tuple[int, dict[int, int]]:
    """``load_by_dataset`` as it was computed before the in-flight marker: every waiting job
    without an unsent row is in flight, read from the job table."""
    rows = session.execute(
        sql_select(Job.dataset_id, Job.status, func.count())
        .where(
            col(Job.status).in_((JobStatus.pending, JobStatus.retrying, JobStatus.running)),
            or_(col(Job.status) == JobStatus.running, ~outbox._unsent()),
        )
        .group_by(col(Job.dataset_id), Job.status)
    ).all()
    load: dict[int, int] = defaultdict(int)
    for dataset_id, _, n in rows:
        load[dataset_id] += n
    return sum(n for _, status, n in rows if status != JobStatus.running), dict(load)


def test_the_jobs_in_flight_are_counted_from_the_rows_marked_in_flight(database_url):
    """A dispatch marks its rows in flight and the claim that takes a message clears them,
    whatever it decides; the count of jobs in flight and running per dataset is the one the
    waiting jobs gave before, through a claim, a cancel of a job whose message is on the queue,
    that message's delivery, and a retry published again."""
    from sluice.storage import jobs

    engine = get_engine(database_url)
    with Session(engine) as session:
        now = db_now(session)
        ds = Dataset(name="flight", collection="flight")
        session.add(ds)
        session.flush()
        _fill(session, ds, 4, now=now)
        session.commit()
        a, b, c, d = session.exec(
            sql_select(Job.id).where(Job.dataset_id == ds.id).order_by(col(Job.id))
        ).scalars()

    def loads() -> tuple[tuple[int, dict[int, int]], tuple[int, dict[int, int]]]:
        with Session(engine) as session:
            now_, load = outbox.load_by_dataset(session=session)
            return (now_, {k: v for k, v in load.items() if v}), _load_as_before(session)

    def claim(job_id: int) -> bool:
        with Session(engine) as session:
            claimed = jobs.claim(session=session, job_id=job_id, worker_id="w", lease_seconds=30)
            return claimed.claimed

    def in_flight() -> set[int]:
        with Session(engine) as session:
            return set(
                session.exec(sql_select(Outbox.job_id).where(col(Outbox.in_flight).is_(True)))
                .scalars()
                .all()
            )

    new, old = loads()
    assert new == old == (0, {})  # nothing sent yet (before: the same)
    sent = outbox.dispatch(engine=engine, publish=lambda job_id: None).sent
    assert sorted(sent) == [a, b, c, d] and in_flight() == {a, b, c, d}
    assert loads() == ((4, {ds.id: 4}), (4, {ds.id: 4}))
    assert claim(a)
    assert in_flight() == {b, c, d}
    assert loads() == ((3, {ds.id: 4}), (3, {ds.id: 4}))  # three on the queue, one running
    with Session(engine) as session:
        [cancelled] = jobs.request_cancel(session=session, job_ids=[b], actor="op")
        session.commit()
    assert cancelled.ok
    assert loads() == ((2, {ds.id: 3}), (2, {ds.id: 3}))  # its message is still on the queue
    assert not claim(b)  # that message arrives: a no-op, which takes it off all the same
    assert in_flight() == {c, d}
    with Session(engine) as session:
        [retried] = jobs.retry(session=session, job_ids=[b], actor="op")
        session.commit()
    assert retried.ok
    assert loads() == ((2, {ds.id: 3}), (2, {ds.id: 3}))  # b waits for its new row to go out
    assert outbox.dispatch(engine=engine, publish=lambda job_id: None).sent == [b]
    assert loads() == ((3, {ds.id: 4}), (3, {ds.id: 4}))


def test_unsent_rows_of_an_older_sluice_get_their_dataset_when_the_schema_is_checked(database_url):
    from sluice.storage.db import fill_outbox_datasets

    engine = get_engine(database_url)
    with Session(engine) as session:
        now = db_now(session)
        ds = Dataset(name="older", collection="older")
        session.add(ds)
        session.flush()
        _fill(session, ds, 3, now=now)
        rows = (
            session.exec(
                sql_select(Outbox)
                .join(Job, col(Job.id) == Outbox.job_id)
                .where(Job.dataset_id == ds.id)
            )
            .scalars()
            .all()
        )
        for row in rows:
            row.dataset_id = None  # as an older Sluice wrote them
        session.commit()
        assert fill_outbox_datasets(engine) == 3
        assert {row.dataset_id for row in session.exec(sql_select(Outbox)).scalars()} == {ds.id}
        assert fill_outbox_datasets(engine) == 0
