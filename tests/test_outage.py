"""The queue Redis goes away: uploads still succeed and every job still reaches a final state."""

import shutil
import time

import pytest

from sluice.ops.ingest import ingest_bytes
from tests.support.helpers import events, ids_of_job, job, wait_for


def doc(i: int) -> bytes:
    return (f"Document {i} talks about topic {i} at length. " * 60 + "\n\n").encode() * 4


def test_upload_while_queue_is_down_is_published_when_it_returns(ctx, services, start_worker):
    from sluice.pipeline.queueing.publishing import publish

    start_worker()
    services.queue.stop()
    try:
        r = ingest_bytes(
            ctx, doc(1), dataset="default", filename="during-outage.txt", publish=publish
        )
    finally:
        services.queue.start()  # same port, same append-only file
    assert r.accepted and not r.published
    assert "queue unreachable" in r.message

    [j] = wait_for(ctx, [r.job_id], timeout=60)

    assert j.status.value == "succeeded"
    assert len(ids_of_job(ctx, r.job_id)) == j.chunk_count


@pytest.mark.slow
def test_queue_redis_lost_mid_flight_with_jobs_queued(ctx, services, start_worker):
    """Stop the queue with jobs queued, bring it back empty: the database republishes them."""
    from sluice.pipeline.queueing.publishing import publish

    results = [
        ingest_bytes(ctx, doc(i), dataset="default", filename=f"d{i}.txt", publish=publish)
        for i in range(8)
    ]
    assert all(r.published for r in results)
    assert services.queue.client().llen(f"huey.redis.{ctx.settings.queue_name}") == 8

    services.queue.stop()
    for item in (services.workdir / "redis-queue").iterdir():  # comes back with an empty dataset
        if item.name != "redis.conf":  # (the server's own configuration stays)
            shutil.rmtree(item) if item.is_dir() else item.unlink()
    services.queue.start()
    assert services.queue.client().dbsize() == 0

    start_worker(env={"SLUICE_FAULTS": "embed_batch=sleep:0.05"})
    jobs = wait_for(ctx, [r.job_id for r in results], timeout=120)

    assert [j.status.value for j in jobs] == ["succeeded"] * 8
    for r, j in zip(results, jobs, strict=True):
        assert len(ids_of_job(ctx, r.job_id)) == j.chunk_count
        assert "republished" in [e.kind for e in events(ctx, r.job_id)]


# --- an outage of a dependency is not the job's failure -------------------------------------------


def run_rounds(ctx, job_id: int, rounds: int) -> list[str]:
    """Run the job as its due retries come (no waiting: a round is due within a second)."""
    from sluice.pipeline.running.runner import run_job

    return [run_job(job_id, ctx=ctx).result for _ in range(rounds)]


def test_chroma_down_for_many_rounds_spends_no_attempt_and_the_job_resumes(database_url, make_ctx):
    from sluice.storage.vectors import VectorStore
    from tests.support.servers import free_port

    ctx = make_ctx(SLUICE_MAX_ATTEMPTS="3")
    up = ctx.vectors
    ctx.__dict__["vectors"] = VectorStore(
        f"http://127.0.0.1:{free_port()}", timeout=5
    )  # nothing there
    r = ingest_bytes(ctx, doc(1), dataset="default", filename="during-outage.txt")

    assert run_rounds(ctx, r.job_id, 8) == ["retrying"] * 8  # far beyond the 3 attempts

    j = job(ctx, r.job_id)
    assert (j.status.value, j.attempt) == ("retrying", 0)
    assert j.waiting_for.startswith("Chroma at http://127.0.0.1:") and j.waiting_since is not None
    assert j.error_message.startswith("waiting for Chroma")
    waits = [e for e in events(ctx, r.job_id) if e.kind == "waiting"]
    assert len(waits) == 8 and "attempt not counted" in waits[0].message
    assert len({e.data["waiting_since"] for e in waits}) == 1  # one outage, one start

    ctx.__dict__["vectors"] = up  # Chroma is back
    assert run_rounds(ctx, r.job_id, 1) == ["succeeded"]
    j = job(ctx, r.job_id)
    assert (j.attempt, j.waiting_for, j.waiting_since) == (1, None, None)
    assert len(ids_of_job(ctx, r.job_id)) == j.chunk_count


def test_a_request_chroma_refused_is_an_outage_even_when_it_answers_again_at_once(
    database_url, make_ctx
):
    """Chroma restarting: the job's request is refused, and by the time the worker asks Chroma
    whether it is down, it answers. The refusal itself says it was an outage: no attempt spent."""
    from sluice import faults
    from sluice.storage.vectors import VectorStore
    from tests.support.servers import free_port

    ctx = make_ctx()
    down = VectorStore(
        f"http://127.0.0.1:{free_port()}", timeout=5
    )  # the refusal a stopped Chroma gives
    refused: list[str] = []

    def refuse(**_):
        if not refused:
            try:
                down.heartbeat()
            except Exception as exc:
                refused.append(repr(exc))
                raise
            raise AssertionError("nothing listens there, yet it answered")

    r = ingest_bytes(ctx, doc(1), dataset="default", filename="restart.txt")
    with faults.hook("embed_batch", refuse):
        assert run_rounds(ctx, r.job_id, 2) == ["retrying", "succeeded"]
    assert refused
    j = job(ctx, r.job_id)
    assert (j.attempt, j.waiting_for) == (1, None)
    [wait] = [e for e in events(ctx, r.job_id) if e.kind == "waiting"]
    assert (
        wait.message.startswith("waiting for Chroma at ") and "attempt not counted" in wait.message
    )
    assert len(ids_of_job(ctx, r.job_id)) == j.chunk_count


def test_an_outage_longer_than_the_maximum_is_a_dead_letter_that_says_so(database_url, make_ctx):
    from sluice.storage.vectors import VectorStore
    from tests.support.servers import free_port

    ctx = make_ctx(SLUICE_MAX_OUTAGE_SECONDS="0.01")
    ctx.__dict__["vectors"] = VectorStore(f"http://127.0.0.1:{free_port()}", timeout=5)
    r = ingest_bytes(ctx, doc(1), dataset="default", filename="during-outage.txt")

    assert run_rounds(ctx, r.job_id, 2) == ["retrying", "failed"]
    j = job(ctx, r.job_id)
    assert (j.error_code, j.attempt, j.waiting_for) == ("outage_too_long", 1, None)
    assert "SLUICE_MAX_OUTAGE_SECONDS" in j.error_message and "Chroma" in j.fix_hint


def test_a_worker_of_another_pipeline_version_leaves_the_job_waiting_for_its_own(
    database_url, make_ctx
):
    ctx = make_ctx()
    r = ingest_bytes(ctx, doc(1), dataset="default", filename="rolling.txt")
    other = make_ctx(SLUICE_CHUNK_SIZE="400")  # a worker not yet given the new settings

    assert run_rounds(other, r.job_id, 7) == ["retrying"] * 7

    j = job(ctx, r.job_id)
    assert (j.status.value, j.attempt, j.error_code) == ("retrying", 0, "pipeline_version_mismatch")
    assert j.waiting_for == f"a worker of pipeline {j.pipeline_version}"
    assert run_rounds(make_ctx(SLUICE_CHUNK_SIZE="800"), r.job_id, 1) == ["succeeded"]
    assert job(ctx, r.job_id).attempt == 1


@pytest.mark.slow
def test_chroma_stopped_in_the_middle_of_a_run_costs_no_attempt(ctx, services, start_worker):
    """Chroma goes away with jobs under way and stays away for many times the retry budget (5
    attempts at 0.2-2 s here): every job waits, and all finish when it is back."""
    from sluice.pipeline.queueing.publishing import publish

    start_worker(env={"SLUICE_FAULTS": "embed_batch=sleep:0.05", "SLUICE_EMBED_BATCH_SIZE": "4"})
    results = [
        ingest_bytes(ctx, doc(i), dataset="default", filename=f"d{i}.txt", publish=publish)
        for i in range(20)
    ]
    ids = [r.job_id for r in results]
    wait_until = time.monotonic() + 60
    while sum(job(ctx, i).status.value == "succeeded" for i in ids) < 3:
        assert time.monotonic() < wait_until, "no job finished before the outage"
        time.sleep(0.05)

    services.chroma.stop()
    try:
        deadline = time.monotonic() + 90
        while max(sum(e.kind == "waiting" for e in events(ctx, i)) for i in ids) < 12:
            assert time.monotonic() < deadline, "no job waited through 12 rounds"
            assert all(job(ctx, i).status.value != "failed" for i in ids), (
                "a job failed during the outage"
            )
            time.sleep(0.2)
        outage = {i: job(ctx, i) for i in ids}
    finally:
        services.chroma.start()

    done = wait_for(ctx, ids, timeout=120)
    assert [j.status.value for j in done] == ["succeeded"] * 20
    spent = {
        j.id: [
            (e.kind, e.stage, e.attempt, e.actor, e.message[:200])
            for e in events(ctx, j.id)
            if e.kind != "waiting"
        ]
        for j in done
        if j.attempt != 1
    }
    assert not spent, f"the outage spent attempts: {spent}"
    waited = [i for i, j in outage.items() if j.waiting_for]
    assert waited and all(outage[i].waiting_for.startswith("Chroma at ") for i in waited)
    for j in done:
        assert len(ids_of_job(ctx, j.id)) == j.chunk_count


def test_a_claim_while_the_database_does_not_answer_waits_and_runs_the_job(make_ctx, monkeypatch):
    """The message is already off the queue when the worker claims: a job database that does not
    answer at that moment must not cost the message (recovery would republish it only a minute
    later)."""
    from sqlalchemy.exc import OperationalError

    from sluice.pipeline.running.runner import run_job
    from sluice.storage import jobs

    ctx = make_ctx(SLUICE_OUTAGE_POLL_SECONDS="0.05")
    r = ingest_bytes(ctx, doc(1), dataset="default", filename="claim-outage.txt")
    real, refused = jobs.claim, []

    def down_twice(**kwargs):
        if len(refused) < 2:
            refused.append(1)
            raise OperationalError(
                "SELECT", {}, Exception("could not connect to server: Connection refused")
            )
        return real(**kwargs)

    monkeypatch.setattr(jobs, "claim", down_twice)
    assert run_job(r.job_id, ctx=ctx).result == "succeeded"
    assert len(refused) == 2 and job(ctx, r.job_id).attempt == 1
