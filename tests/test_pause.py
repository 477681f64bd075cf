"""Pause and resume, on SQLite and PostgreSQL and with a real consumer: a paused dataset's jobs are
not claimed (a recorded no-op that says so) nor published, running jobs finish, uploads are still
accepted, and resuming publishes what waited."""

from __future__ import annotations

from sqlmodel import Session, select

from sluice.storage import jobs, pauses
from sluice.storage.db import get_engine
from sluice.storage.models import Job, JobStatus, Outbox
from sluice.storage.outbox import dispatch, redeliver_stranded
from tests.support.helpers import events, make_job, until, wait_for


def _job(engine, dataset: str, n: int) -> tuple[int, int]:
    job = make_job(engine, dataset, n)
    return job.id, job.dataset_id


def _claim(engine, job_id: int) -> jobs.ClaimResult:
    with Session(engine, expire_on_commit=False) as session:
        return jobs.claim(session=session, job_id=job_id, worker_id="w1", lease_seconds=30)


def _unsent(engine, job_id: int) -> int:
    with Session(engine) as session:
        return len(
            session.exec(
                select(Outbox).where(Outbox.job_id == job_id, Outbox.sent_at.is_(None))
            ).all()
        )


def test_a_paused_dataset_is_neither_claimed_nor_published_until_resumed(database_url):
    engine = get_engine(database_url)
    a, ds_a = _job(engine, "a", 1)
    b, _ = _job(engine, "b", 2)
    sent: list[int] = []
    dispatch(engine=engine, publish=sent.append)  # both messages are on the queue already
    assert sorted(sent) == [a, b]
    with Session(engine) as session:
        made = pauses.pause(session=session, dataset_id=ds_a, actor="alice", reason="new parser")
        assert made[1]
        assert not pauses.pause(session=session, dataset_id=ds_a, actor="bob")[1]  # already paused

    refused = _claim(engine, a)  # its message arrives while the dataset is paused
    assert not refused.claimed and "paused" in refused.reason and "alice" in refused.reason
    assert refused.job.status == JobStatus.pending
    assert _unsent(engine, a) == 1  # waits to be published again on resume
    assert _claim(engine, b).claimed  # other datasets run

    c, _ = _job(engine, "a", 3)  # uploads are still accepted
    sent.clear()
    dispatch(engine=engine, publish=sent.append)
    assert sent == []  # neither the refused job nor the new upload is published while paused
    with Session(engine) as session:  # nor re-published as stranded
        assert redeliver_stranded(session=session, older_than_seconds=0, queued_job_ids=[]) == []

    with Session(engine) as session:
        assert pauses.resume(session=session, dataset_id=ds_a)
        assert not pauses.resume(session=session, dataset_id=ds_a)
    dispatch(engine=engine, publish=sent.append)
    assert sorted(sent) == [a, c]
    assert _claim(engine, a).claimed


def test_pausing_the_whole_queue_stops_every_dataset(database_url):
    engine = get_engine(database_url)
    a, _ = _job(engine, "a", 1)
    with Session(engine) as session:
        pauses.pause(session=session, dataset_id=None, actor="alice")
        assert [p["scope"] for p in pauses.active(session=session)] == ["all"]
    refused = _claim(engine, a)
    assert not refused.claimed and "whole queue" in refused.reason
    sent: list[int] = []
    dispatch(engine=engine, publish=sent.append)
    assert sent == []
    with Session(engine) as session:
        pauses.resume(session=session, dataset_id=None)
    dispatch(engine=engine, publish=sent.append)
    assert sent == [a]
    with Session(engine) as session:
        assert session.get(Job, a).status == JobStatus.pending


def test_pause_and_resume_a_dataset_with_a_real_consumer(make_ctx, start_worker, capsys):
    """A message already on the queue for a paused dataset is refused by the worker and waits;
    another dataset runs meanwhile; `sluice resume` publishes it again and it runs."""
    from sluice.cli.main import main as cli
    from sluice.ops.ingest import ingest_bytes
    from sluice.pipeline.queueing.publishing import publish

    ctx = make_ctx(SLUICE_DISPATCH_PER_THREAD="2")  # with the dispatch window, as in production

    held = ingest_bytes(
        ctx,
        b"a page of the paused dataset. " * 100,
        dataset="paused",
        filename="held.txt",
        publish=publish,
    )
    assert held.published  # its message is on the queue before the pause
    assert cli(["pause", "--dataset", "paused", "--reason", "parser upgrade"]) == 0
    assert "dataset paused is paused" in capsys.readouterr().out
    start_worker(workers=1)
    until(
        lambda: any("paused" in e.message for e in events(ctx, held.job_id) if e.kind == "noop"),
        timeout=30,
        what="the worker refused the paused dataset's job",
    )
    other = ingest_bytes(
        ctx,
        b"a page of another dataset. " * 100,
        dataset="other",
        filename="other.txt",
        publish=publish,
    )
    late = ingest_bytes(
        ctx,
        b"uploaded while paused. " * 100,
        dataset="paused",
        filename="late.txt",
        publish=publish,
    )
    assert late.accepted
    wait_for(ctx, [other.job_id], timeout=30)
    from sluice.ops import reads

    detail = reads.job_detail(held.job_id)
    assert (
        detail.row["status"] == "pending"
        and "paused" in detail.paused
        and "parser upgrade" in detail.paused
    )
    assert reads.job_detail(late.job_id).row["status"] == "pending"
    assert cli(["pause", "--list"]) == 0
    assert "parser upgrade" in capsys.readouterr().out

    assert cli(["resume", "--dataset", "paused"]) == 0
    assert "resumed" in capsys.readouterr().out
    done = wait_for(ctx, [held.job_id, late.job_id], timeout=30)
    assert {j.status for j in done} == {JobStatus.succeeded}
    assert cli(["resume", "--dataset", "paused"]) == 1  # nothing to resume any more


def test_a_running_job_finishes_when_its_dataset_is_paused(ctx):
    """Pausing stops claims, not attempts under way: the pause lands between claim and success."""
    from sluice import faults
    from sluice.ops import pausing
    from sluice.ops.access import cli_operator
    from sluice.ops.ingest import ingest_bytes
    from sluice.pipeline.running.runner import run_job

    r = ingest_bytes(ctx, b"a page that runs while paused. " * 100, dataset="d", filename="run.txt")
    with Session(ctx.engine) as session:
        ds = session.get(Job, r.job_id).dataset_id
    paused = []
    with faults.hook(
        "after_claim", lambda **_: paused.append(pausing.pause(cli_operator(), dataset_id=ds))
    ):
        run_job(r.job_id, ctx=ctx)
    assert paused and paused[0].ok
    with Session(ctx.engine) as session:
        assert session.get(Job, r.job_id).status == JobStatus.succeeded


def test_the_overview_pauses_and_resumes_the_selected_dataset(ctx):
    from sluice.ops.ingest import ingest_bytes
    from tests.support.apptest import assert_ok, open_console, texts

    ingest_bytes(ctx, b"some text. " * 50, dataset="archive", filename="a.txt")
    at = open_console()
    at.sidebar.selectbox(key="dataset").set_value("archive").run()
    at.text_input(key="pause_reason").set_value("migration")
    at.button(key="pause_scope").click().run()
    at.button(key="pause_scope:yes").click().run()
    assert_ok(at)
    assert "Paused" in texts(at) and "dataset archive" in texts(at) and "migration" in texts(at)
    [button] = [b for b in at.button if b.key and b.key.startswith("resume_")]
    button.click().run()
    assert_ok(at)
    assert "resumed" in texts(at)
    assert not [b for b in at.button if b.key and b.key.startswith("resume_")]
