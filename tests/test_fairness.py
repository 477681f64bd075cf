"""Priority and fairness: the dispatcher keeps only a few messages in flight on the queue and picks
what to publish next by priority, then across datasets, then age. So one upload to a quiet dataset
starts within about two jobs of a dataset with hundreds queued, and "run next" means next."""

from __future__ import annotations

from datetime import datetime

from sqlmodel import Session, select

from sluice.storage import jobs
from sluice.storage.db import get_engine
from sluice.storage.models import Dataset, JobEvent
from sluice.storage.outbox import dispatch
from tests.support.helpers import job, make_job, wait_for


def _claim(engine, job_id: int) -> None:
    with Session(engine) as session:
        assert jobs.claim(session=session, job_id=job_id, worker_id="w", lease_seconds=30).claimed


def test_the_dispatcher_keeps_a_window_and_shares_it_across_datasets(database_url):
    engine = get_engine(database_url)
    big = [make_job(engine, "big", n).id for n in range(20)]
    small = make_job(engine, "small", 100).id
    sent: list[int] = []
    dispatch(engine=engine, publish=sent.append, window=4)
    assert len(sent) == 4 and small in sent[:2]  # the quiet dataset gets its turn at once
    again: list[int] = []
    dispatch(engine=engine, publish=again.append, window=4)
    assert again == []  # the window is full until messages are claimed
    for job_id in sent[:2]:
        _claim(engine, job_id)
    dispatch(engine=engine, publish=again.append, window=4)
    assert len(again) == 2 and set(again) <= set(big)
    assert again == sorted(again)  # within a dataset, oldest first

    later = make_job(engine, "big", 50).id  # run next: ahead of every older job of its dataset
    with Session(engine) as session:
        assert [r.ok for r in jobs.run_next(session=session, job_ids=[later], actor="alice")] == [
            True
        ]
    _claim(engine, again[0])
    nxt: list[int] = []
    dispatch(engine=engine, publish=nxt.append, window=4)
    assert nxt == [later]


def test_a_dataset_priority_goes_first(database_url):
    engine = get_engine(database_url)
    low = [make_job(engine, "low", n).id for n in range(3)]
    high = [make_job(engine, "high", 10 + n).id for n in range(3)]
    with Session(engine) as session:
        ds = session.exec(select(Dataset).where(Dataset.name == "high")).one()
        jobs.set_dataset_priority(session=session, dataset_id=ds.id, priority=5)
    sent: list[int] = []
    dispatch(engine=engine, publish=sent.append, window=3)
    assert sent == high
    dispatch(engine=engine, publish=sent.append, window=0)  # 0: no window, everything due goes
    assert sent[3:] == low


def test_one_upload_to_a_quiet_dataset_starts_within_about_two_jobs(make_ctx, start_worker):
    """200 jobs queued in one dataset, then one in another: with a real consumer the lone job starts
    after at most a window's worth of the big dataset's jobs, not after the 200."""
    from sluice.ops.ingest import ingest_bytes
    from sluice.pipeline.queueing.publishing import publish

    ctx = make_ctx(SLUICE_DISPATCH_PER_THREAD="2")  # two worker threads: four messages on the queue
    big = [
        ingest_bytes(
            ctx,
            f"big document {n}. ".encode() * 40,
            dataset="big",
            filename=f"b{n}.txt",
            publish=publish,
        ).job_id
        for n in range(200)
    ]
    lone = ingest_bytes(
        ctx, b"the lone document. " * 40, dataset="lone", filename="lone.txt", publish=publish
    ).job_id
    start_worker(workers=2)
    wait_for(ctx, [lone], timeout=60)
    with Session(ctx.engine) as session:
        claims = [
            e.job_id
            for e in session.exec(
                select(JobEvent).where(JobEvent.kind == "claimed").order_by(JobEvent.id)
            ).all()
        ]
    before = claims.index(lone)
    assert before <= 4 + 2, f"the lone job started after {before} jobs of the big dataset"
    assert job(ctx, lone).status.value == "succeeded"
    assert set(claims[:before]) <= set(big)


def test_cli_and_console_move_jobs_to_the_front(ctx, capsys):
    from sluice.cli.main import main as cli
    from tests.support.apptest import assert_ok, open_console, texts

    first = make_job(ctx.engine, "docs", 1).id
    second = make_job(ctx.engine, "docs", 2).id
    assert cli(["priority", "3", "--dataset", "docs"]) == 0
    assert cli(["run-next", str(second)]) == 0
    assert "run next (4)" in capsys.readouterr().out
    assert job(ctx, second).priority == 4 and job(ctx, first).priority is None
    assert cli(["priority", "default", str(second)]) == 0
    assert job(ctx, second).priority is None

    at = open_console("jobs", query={"job": str(first)})
    at.button(key=f"run_next_{first}").click().run()
    assert_ok(at)
    assert "Run next" in texts(at) and job(ctx, first).priority == 4


def _places(engine, ids: list[int], *, window: bool, reach=None) -> dict[int, int]:
    from sluice.storage.outbox import queue_place

    with Session(engine) as session:
        return {
            i: queue_place(session=session, job_id=i, dataset_ids=reach, window=window) for i in ids
        }


def test_a_job_s_place_in_the_queue_is_the_dispatcher_s_order(database_url):
    """queue_place counts the jobs the dispatcher would publish first (its order, not the upload
    order), and for a key of some datasets only theirs."""
    engine = get_engine(database_url)
    big = [make_job(engine, "big", n).id for n in range(9)]
    mid = [make_job(engine, "mid", 20 + n).id for n in range(4)]
    small = [make_job(engine, "small", 40 + n).id for n in range(2)]
    busy: list[int] = []
    dispatch(engine=engine, publish=busy.append, window=3)  # three in flight, one then running
    _claim(engine, busy[0])
    urgent = make_job(engine, "mid", 60).id
    with Session(engine) as session:
        jobs.run_next(session=session, job_ids=[urgent], actor="alice")
        ds = session.exec(select(Dataset).where(Dataset.name == "small")).one()
    waiting = [i for i in big + mid + small + [urgent] if i not in busy]
    windowed = _places(engine, waiting, window=True)
    fifo = _places(engine, waiting, window=False)
    mine = _places(engine, waiting, window=True, reach=[ds.id])
    assert set(_places(engine, busy[1:], window=True).values()) <= {0, 1}  # on the queue already

    order: list[int] = []
    dispatch(engine=engine, publish=order.append, window=1000)
    assert order[0] == urgent and order != sorted(order)  # run next first, then turns
    assert windowed == {job_id: 2 + n for n, job_id in enumerate(order)}  # two still in flight
    assert sorted(fifo.values()) == list(range(2, 2 + len(waiting))) and fifo[urgent] == 2
    own, flying = [i for i in order if i in small], len(set(small) & set(busy[1:]))
    assert flying and own  # one of its jobs is on the queue, one waits in the outbox
    assert {i: mine[i] for i in own} == {i: flying + n for n, i in enumerate(own)}  # only its own


def test_a_key_of_one_dataset_sees_its_place_among_its_own_jobs_only(database_url, monkeypatch):
    """The API's waiting: its place and start estimate; a key that does not see the other
    datasets gets the same answer however much they hold."""
    from sluice.api import scoped
    from sluice.ops.keys import ApiPrincipal
    from sluice.settings import reset_settings_cache

    monkeypatch.setenv("SLUICE_DISPATCH_PER_THREAD", "2")  # a window: datasets take turns
    reset_settings_cache()
    from sluice.ops import diagnosis

    # a worker of two threads alive (its presence key, as sluice.ops.diagnosis reads it)
    monkeypatch.setattr(diagnosis, "fleet", lambda _instance: diagnosis.Fleet(True, 1, 2))
    engine = get_engine(database_url)
    for n in range(6):
        make_job(engine, "other", n)
    done, waiting = make_job(engine, "team", 100), make_job(engine, "team", 101)
    with Session(engine) as session:
        claimed = jobs.claim(session=session, job_id=done.id, worker_id="w", lease_seconds=30)
        jobs.succeed(
            session=session,
            job_id=done.id,
            lease=claimed.job.lease,
            worker_id="w",
            built=jobs.Built(chunks=3, pages=1, embedded=3, cached=0),
        )
    team = ApiPrincipal(1, "team", "read", False, frozenset({waiting.dataset_id}))
    every = ApiPrincipal(2, "ops", "read", True, frozenset())
    seen = scoped.job(team, waiting.id)["waiting"]
    assert seen["reason"] == "queue" and seen["ahead"] == 0 and seen["starts_at"]
    assert "of its dataset" in seen["detail"]
    assert scoped.job(every, waiting.id)["waiting"]["ahead"] == 1  # turns: the older head first
    for n in range(20):
        make_job(engine, "other", 200 + n)
    again = scoped.job(team, waiting.id)["waiting"]
    start = datetime.fromisoformat(seen.pop("starts_at"))
    assert abs((datetime.fromisoformat(again.pop("starts_at")) - start).total_seconds()) <= 15
    assert again == seen
