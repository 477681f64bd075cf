"""A retry is published when its backoff ends, not when recovery next comes round. bench.scale
(SLUICE_RECOVERY_INTERVAL_SECONDS=3600) saw a retry due in 1 s run 62 to 75 s later: the worker's
loop slept its hour, so only the periodic task published it, once a minute; and that one-shot
round, finding every reaper silent for longer than ``silence_seconds``, waited out the reaping's
grace (15 s) in line before it published anything."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import update
from sqlmodel import Session, select

from sluice.ops.ingest import ingest_bytes
from sluice.storage.models import Instance
from tests.support.helpers import events, wait_for
from tests.test_jobstore import new_job

TEXT = b"The annual report of the water station. " * 30


def test_a_one_shot_round_after_a_silence_publishes_what_is_due_before_it_waits(
    database_url, make_ctx, monkeypatch
):
    """``sluice recover`` and the periodic task wait out the grace after a silence in line, before
    they reap: the outbox goes first, so a due retry never waits behind the reaping."""
    from sluice.pipeline.queueing import recovery

    ctx = make_ctx()
    recovery.run_once(ctx, publish=lambda _id: None)  # a tick: the database answers
    due = new_job(ctx.engine, 1)  # its outbox row is due now
    with Session(ctx.engine) as session:  # no reaper ticked for longer than a silence
        tick = session.exec(select(Instance)).one().reaper_tick_at
        session.execute(
            update(Instance).values(
                reaper_tick_at=tick - timedelta(seconds=recovery.silence_seconds(ctx.settings) + 1)
            )
        )
        session.commit()

    published: list[int] = []
    published_at_the_wait: list[list[int]] = []
    monkeypatch.setattr(recovery, "_sleep", lambda _s: published_at_the_wait.append(published[:]))
    report = recovery.run_once(ctx, publish=published.append)

    assert report.reap_waited_seconds > 0  # it did wait in line, once
    assert published_at_the_wait == [[due]], "the round waited before it published the due row"
    assert report.published == [due]


@pytest.mark.slow
def test_a_retry_runs_when_due_although_the_workers_recovery_interval_is_an_hour(ctx, start_worker):
    """As in bench.scale: the loop's round comes once an hour, the periodic task once a minute.
    The job's first attempt fails (a transient fault, backoff of at most 0.2 s); its worker
    publishes the retry when due, and the job succeeds within seconds."""
    from sluice.pipeline.queueing.publishing import publish

    start_worker(
        env={"SLUICE_RECOVERY_INTERVAL_SECONDS": "3600", "SLUICE_FAULTS": "after_parse@1=transient"}
    )
    r = ingest_bytes(ctx, TEXT, dataset="default", filename="report.txt", publish=publish)
    [job] = wait_for(ctx, [r.job_id], timeout=20)  # the periodic task would come after 60 s

    assert job.status.value == "succeeded" and job.attempt == 2
    kinds = [e.kind for e in events(ctx, r.job_id)]
    assert kinds.count("attempt_failed") == 1 and kinds[-1] == "succeeded"
