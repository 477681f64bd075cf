"""Races of the job engine's recovery and versions, forced with hooks, on SQLite and PostgreSQL:
``sluice reindex --all`` and a job waiting for a worker of its version; a recovery loop's hold and
the fleet's newer silence."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import update
from sqlmodel import Session, select

from sluice import faults
from sluice.storage import jobs
from sluice.storage.models import Document, Instance, Job, JobStatus
from tests.test_jobstore import claim, get, new_job
from tests.test_races import TEXT, make_stale

OTHER_TEXT = TEXT.replace(b"lighthouse", b"windmill")


def _waits_for_its_old_version(ctx, job_id: int) -> Job:
    """Run the job on a worker of another version: it waits (attempt unspent) for one of its
    own, which after a change of every worker's settings never comes."""
    from sluice.pipeline.running.runner import run_job

    assert run_job(job_id, ctx=ctx).result == "retrying"
    j = get(ctx.engine, job_id)
    assert j.status == JobStatus.retrying and (j.waiting_for or "").startswith("a worker of")
    return j


def test_reindex_all_moves_an_active_jobs_rebuild_that_waits_for_its_old_version(
    database_url, make_ctx
):
    from sluice.ops.reindex import reindex_all
    from sluice.pipeline.running.runner import run_job
    from tests.support.helpers import run_file

    old = make_ctx()
    built = run_file(old, TEXT, "survey.txt")
    assert built.status == JobStatus.succeeded
    with Session(old.engine) as session:  # a rebuild of the active job is queued ...
        assert jobs.reindex(session=session, job_ids=[built.id], actor="op")[0].ok
    new = make_ctx(SLUICE_CHUNK_SIZE="600")  # ... and every worker now makes another version
    assert new.pipeline_version != built.pipeline_version
    _waits_for_its_old_version(new, built.id)

    result = reindex_all(new, actor="cli:op")

    assert result.queued == 1, (result.to_dict(), get(new.engine, built.id).status)
    [queued] = [r.job_id for r in result.results if r.ok]
    assert queued != built.id
    assert get(new.engine, built.id).status == JobStatus.succeeded  # search still serves it
    assert get(new.engine, queued).pipeline_version == new.pipeline_version
    assert run_job(queued, ctx=new).result == "succeeded"
    with Session(new.engine) as session:
        assert session.get(Document, built.document_id).active_job_id == queued


def test_reindex_all_moves_a_job_that_waits_for_a_worker_of_its_old_version(database_url, make_ctx):
    from sluice.ops.ingest import ingest_bytes
    from sluice.ops.reindex import reindex_all
    from sluice.pipeline.running.runner import run_job

    old = make_ctx()
    r = ingest_bytes(old, OTHER_TEXT, dataset="default", filename="mills.txt")
    new = make_ctx(SLUICE_CHUNK_SIZE="600")
    _waits_for_its_old_version(new, r.job_id)

    result = reindex_all(new, actor="cli:op")

    assert [x.job_id for x in result.results if x.ok] == [r.job_id], result.to_dict()
    j = get(new.engine, r.job_id)
    assert (j.pipeline_version, j.waiting_for) == (new.pipeline_version, None)
    assert run_job(r.job_id, ctx=new).result == "succeeded"  # due now, not after the outage limit


# --- a recovery loop's hold and the fleet's newer silence -----------------------------------------


def _silence(ctx) -> None:
    """No reaper ticked for longer than the silence: the last tick moves back, as time would."""
    from sluice.pipeline.queueing import recovery

    with Session(ctx.engine) as session:
        tick = session.exec(select(Instance)).one().reaper_tick_at
        back = timedelta(seconds=recovery.silence_seconds(ctx.settings) + 1)
        session.execute(update(Instance).values(reaper_tick_at=tick - back))
        session.commit()


def _another_reaper_finds_a_silence(ctx) -> None:
    from sluice.pipeline.queueing import recovery

    _silence(ctx)
    with Session(ctx.engine) as session:
        tick = jobs.reaper_tick(
            session=session,
            silence_seconds=recovery.silence_seconds(ctx.settings),
            grace_seconds=recovery.grace_seconds(ctx.settings),
        )
    assert tick is not None and tick.silence


def test_a_loop_whose_hold_came_due_keeps_to_a_newer_silence_of_the_fleet(
    database_url, make_ctx, monkeypatch
):
    """The loop's own hold (after a first silence) is over by its clock; meanwhile the job database
    was down again and another reaper, the first back, recorded a newer silence and its grace. The
    loop reaps only after that grace: the live worker's beat lands within it."""
    from sluice.pipeline.queueing import recovery

    ctx = make_ctx()
    clock = [1000.0]
    monkeypatch.setattr(recovery, "_monotonic", lambda: clock[0])
    monkeypatch.setattr(recovery, "_sleep", lambda s: (_ for _ in ()).throw(AssertionError(s)))
    hold = recovery.ReapHold()
    assert recovery.run_once(ctx, publish=lambda _id: None, hold=hold).reaped == []  # a tick
    alive = new_job(ctx.engine, 1)
    lease = claim(ctx.engine, alive).job.lease
    _silence(ctx)
    first = recovery.run_once(ctx, publish=lambda _id: None, hold=hold)
    assert first.reaped == [] and first.reap_held_seconds > 0

    clock[0] += first.reap_held_seconds + 1  # the loop's hold is over by its own clock ...
    make_stale(ctx.engine, alive)  # ... but the database was down again: no beat could land
    _another_reaper_finds_a_silence(ctx)

    held = recovery.run_once(ctx, publish=lambda _id: None, hold=hold)
    assert held.reaped == [] and held.reap_held_seconds > 0
    assert get(ctx.engine, alive).status == JobStatus.running
    with Session(ctx.engine) as session:  # the live worker beats within the newer grace
        assert jobs.heartbeat(session=session, job_id=alive, lease=lease)
    clock[0] += held.reap_held_seconds + 1
    assert recovery.run_once(ctx, publish=lambda _id: None, hold=hold).reaped == []
    assert get(ctx.engine, alive).status == JobStatus.running


def test_a_silence_recorded_between_a_loops_tick_and_its_reap_holds_that_reap(
    database_url, make_ctx, monkeypatch
):
    """The loop ticked (no hold), then stalled before it read the stale jobs while the database was
    down; another reaper, back first, recorded the silence. The stalled loop's reap takes nothing
    back: the heartbeats it reads are stale because of that outage."""
    from sluice.pipeline.queueing import recovery

    ctx = make_ctx()
    hold = recovery.ReapHold()
    assert recovery.run_once(ctx, publish=lambda _id: None, hold=hold).reaped == []
    alive = new_job(ctx.engine, 1)
    claim(ctx.engine, alive)
    make_stale(ctx.engine, alive)
    seen: list[int] = []

    def the_fleet_records_a_silence(job_id: int) -> None:
        seen.append(job_id)
        _another_reaper_finds_a_silence(ctx)

    with faults.hook("reap_selected", the_fleet_records_a_silence):
        report = recovery.run_once(ctx, publish=lambda _id: None, hold=hold)
    assert seen == [alive]
    assert report.reaped == []
    assert get(ctx.engine, alive).status == JobStatus.running


# --- a worker's stop hands its jobs back, as an event ---------------------------------------------


def test_a_hand_back_at_a_workers_stop_is_an_event_of_the_transition(database_url, make_ctx):
    from sluice.pipeline.running import stopping
    from sluice.storage.models import JobEvent

    ctx = make_ctx()
    job_id = new_job(ctx.engine, 1)
    with Session(ctx.engine) as session:
        assert jobs.claim(
            session=session, job_id=job_id, worker_id=ctx.worker_id, lease_seconds=30
        ).claimed
    assert stopping.hand_back_all(ctx, reason="the worker stopped") == [job_id]
    with Session(ctx.engine) as session:
        last = session.exec(
            select(JobEvent).where(JobEvent.job_id == job_id).order_by(JobEvent.id.desc())
        ).first()
    assert (last.kind, last.from_status, last.to_status) == ("handed_back", "running", "pending")
    assert "the worker stopped" in last.message
    assert get(ctx.engine, job_id).status == JobStatus.pending
