"""Retention on SQLite and PostgreSQL: old history of finished jobs and superseded versions go, dead
letters stay until dismissed, active jobs are never touched; a dry run counts exactly what goes."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import update
from sqlmodel import Session, func, select

from sluice.storage import jobs, retention
from sluice.storage.db import get_engine
from sluice.storage.models import Job, JobEvent, JobStatus, Outbox, utcnow
from tests.support.helpers import make_job


def _job(engine, n: int, status: JobStatus, *, days_ago: int, dismissed: bool = False) -> int:
    made = make_job(engine, "default", n)
    with Session(engine, expire_on_commit=False) as session:
        job = session.get(Job, made.id)
        for kind in (
            "claimed",
            "attempt_failed",
            "claimed",
            {"succeeded": "succeeded", "failed": "failed"}.get(status.value, "claimed"),
        ):
            jobs.add_event(session, job, kind, message=kind)
        session.flush()
        when = utcnow() - timedelta(days=days_ago)
        session.execute(
            update(Job)
            .where(Job.id == job.id)
            .values(status=status, finished_at=when, updated_at=when, dismissed=dismissed)
        )
        session.execute(update(Outbox).where(Outbox.job_id == job.id).values(sent_at=when))
        session.commit()
        return job.id


def _events(engine, job_id: int) -> list[str]:
    with Session(engine) as session:
        return list(
            session.exec(
                select(JobEvent.kind).where(JobEvent.job_id == job_id).order_by(JobEvent.id)
            )
        )


def test_prune_keeps_what_matters_and_a_dry_run_counts_exactly(database_url):
    engine = get_engine(database_url)
    old_ok = _job(engine, 1, JobStatus.succeeded, days_ago=40)
    new_ok = _job(engine, 2, JobStatus.succeeded, days_ago=2)
    dead = _job(engine, 3, JobStatus.failed, days_ago=40)
    dismissed = _job(engine, 4, JobStatus.failed, days_ago=40, dismissed=True)
    superseded = _job(engine, 5, JobStatus.superseded, days_ago=40)
    running = _job(engine, 6, JobStatus.running, days_ago=40)
    before = {j: _events(engine, j) for j in (old_ok, new_ok, dead, dismissed, running)}
    cutoff = utcnow() - timedelta(days=30)

    with Session(engine) as session:
        dry = retention.prune(session=session, cutoff=cutoff, dry_run=True)
    assert {j: _events(engine, j) for j in before} == before  # a dry run changes nothing
    with Session(engine) as session:
        done = retention.prune(session=session, cutoff=cutoff, dry_run=False)
    assert (dry.events, dry.superseded_jobs, dry.outbox) == (
        done.events,
        done.superseded_jobs,
        done.outbox,
    )
    assert done.events == (len(before[old_ok]) - 1) + (len(before[dismissed]) - 1)
    assert done.superseded_jobs == 1

    assert _events(engine, old_ok) == ["succeeded"]  # what it built stays
    assert _events(engine, dismissed) == ["failed"]
    assert _events(engine, new_ok) == before[new_ok]  # younger than the cutoff
    assert _events(engine, dead) == before[dead]  # a dead letter keeps its history until dismissed
    assert _events(engine, running) == before[running]  # never an active job
    with Session(engine) as session:
        assert session.get(Job, superseded) is None and session.get(Job, old_ok) is not None
        assert (
            session.exec(
                select(func.count()).select_from(JobEvent).where(JobEvent.job_id == superseded)
            ).one()
            == 0
        )
        assert (
            session.exec(
                select(func.count()).select_from(Outbox).where(Outbox.sent_at < cutoff)
            ).one()
            == 0
        )
    with Session(engine) as session:  # a second run finds nothing more
        again = retention.prune(session=session, cutoff=cutoff, dry_run=False)
    assert (again.events, again.superseded_jobs, again.outbox) == (0, 0, 0)


def test_cli_prune_dry_run_then_prune(ctx, capsys):
    from sluice.cli import main

    old = _job(ctx.engine, 9, JobStatus.succeeded, days_ago=40)
    assert main(["prune", "--dry-run"]) == 0
    assert (
        "would remove 4 event(s)" in capsys.readouterr().out
    )  # created, claimed, failed attempt, claimed
    assert len(_events(ctx.engine, old)) == 5
    assert main(["prune"]) == 0
    assert "removed 4 event(s)" in capsys.readouterr().out and _events(ctx.engine, old) == [
        "succeeded"
    ]


def test_idempotency_records_past_24_hours_go_with_retention_not_with_a_request(database_url):
    """A POST no longer deletes every expired record (a write on each request); its own expired
    key counts as unused, and the retention job removes the rest."""
    from sluice.storage import idempotency_records as records
    from sluice.storage.models import IdempotencyRecord

    engine = get_engine(database_url)
    with Session(engine) as session:
        made = {
            (key, name): records.claim(
                session=session, key_id=key, idempotency_key=name, fingerprint="f"
            ).record_id
            for key, name in ((1, "old"), (2, "other-old"), (1, "young"))
        }
        aged = [made[1, "old"], made[2, "other-old"]]
        session.execute(
            update(IdempotencyRecord)
            .where(IdempotencyRecord.id.in_(aged))
            .values(created_at=utcnow() - timedelta(hours=25))
        )
        session.commit()
        assert records.claim(session=session, key_id=1, idempotency_key="new", fingerprint="f")
        again = records.claim(session=session, key_id=1, idempotency_key="old", fingerprint="g")
        assert again.verdict == "first"  # expired: not "another request under a used key"
        assert session.exec(select(func.count()).select_from(IdempotencyRecord)).one() == 4

        cutoff = utcnow() - timedelta(days=30)
        dry = retention.prune(session=session, cutoff=cutoff, dry_run=True)
        assert dry.idempotency == 1 and "1 idempotency record(s)" in dry.describe()
        assert retention.prune(session=session, cutoff=cutoff, dry_run=False).idempotency == 1
        left = session.exec(select(IdempotencyRecord.key_id, IdempotencyRecord.idempotency_key))
        assert sorted(left.all()) == [(1, "new"), (1, "old"), (1, "young")]


def test_the_daily_prune_removes_expired_idempotency_records_also_when_keeping_everything(
    make_ctx,
):
    from sluice.storage import idempotency_records as records
    from sluice.storage.models import IdempotencyRecord
    from sluice.worker.hooks import periodic_prune

    ctx = make_ctx(SLUICE_RETENTION_DAYS="0")  # 0: the job history is kept for ever
    with Session(ctx.engine) as session:
        old = records.claim(session=session, key_id=1, idempotency_key="k", fingerprint="f")
        session.execute(
            update(IdempotencyRecord)
            .where(IdempotencyRecord.id == old.record_id)
            .values(created_at=utcnow() - timedelta(hours=25))
        )
        session.commit()
    periodic_prune.call_local()
    with Session(ctx.engine) as session:
        assert session.exec(select(func.count()).select_from(IdempotencyRecord)).one() == 0
