"""The queue Redis goes away: uploads still succeed and every job still reaches a final state."""

import shutil

import pytest

from sluice.ops.ingest import ingest_bytes
from tests.helpers import events, ids_of_job, wait_for


def doc(i: int) -> bytes:
    return (f"Document {i} talks about topic {i} at length. " * 60 + "\n\n").encode() * 4


def test_upload_while_queue_is_down_is_published_when_it_returns(ctx, services, start_worker):
    from sluice.pipeline.queue import publish

    start_worker()
    services.queue.stop()
    try:
        r = ingest_bytes(ctx, doc(1), dataset="default", filename="during-outage.txt", publish=publish)
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
    from sluice.pipeline.queue import publish

    results = [ingest_bytes(ctx, doc(i), dataset="default", filename=f"d{i}.txt", publish=publish)
               for i in range(8)]
    assert all(r.published for r in results)
    assert services.queue.client().llen(f"huey.redis.{ctx.settings.queue_name}") == 8

    services.queue.stop()
    shutil.rmtree(services.workdir / "redis-queue")  # comes back with an empty dataset
    (services.workdir / "redis-queue").mkdir()
    services.queue.start()
    assert services.queue.client().dbsize() == 0

    start_worker(env={"SLUICE_FAULTS": "embed_batch=sleep:0.05"})
    jobs = wait_for(ctx, [r.job_id for r in results], timeout=120)

    assert [j.status.value for j in jobs] == ["succeeded"] * 8
    for r, j in zip(results, jobs, strict=True):
        assert len(ids_of_job(ctx, r.job_id)) == j.chunk_count
        assert "republished" in [e.kind for e in events(ctx, r.job_id)]
