"""Crashes of real huey_consumer processes: the job database brings every job to its end exactly
once."""

import time

import pytest

from sluice.ops.ingest import ingest_bytes
from sluice.storage.vectors import chunk_id
from tests.support.helpers import collection, events, ids_of_job, job, wait_for

pytestmark = pytest.mark.slow

LONG = "".join(
    f"Section {i} of the field guide describes species {i} in detail. " * 12 + "\n\n"
    for i in range(60)
).encode()


def expected_ids(ctx, r):
    j = job(ctx, r.job_id)
    from sqlmodel import Session

    from sluice.storage.models import Document

    with Session(ctx.engine) as session:
        sha = session.get(Document, r.document_id).sha256
    return sorted(chunk_id(sha, j.pipeline_version, i) for i in range(j.chunk_count))


def wait_until(predicate, timeout=60, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_crash_after_indexing_before_success_is_redelivered_without_duplicates(ctx, start_worker):
    from sluice.pipeline.queueing.publishing import publish

    doomed = start_worker(env={"SLUICE_FAULTS": "after_index=exit"}, name="doomed")
    r = ingest_bytes(ctx, LONG, dataset="default", filename="guide.txt", publish=publish)
    wait_until(lambda: not doomed.alive(), 60, "the worker to die after indexing")
    j = job(ctx, r.job_id)
    assert j.status.value == "running" and j.stage.value == "indexing"
    written = ids_of_job(ctx, r.job_id)
    assert written  # vectors are in, success was never recorded

    start_worker(name="rescuer")
    [j] = wait_for(ctx, [r.job_id], timeout=90)

    assert j.status.value == "succeeded" and j.attempt == 2
    assert ids_of_job(ctx, r.job_id) == expected_ids(ctx, r) == written
    kinds = [e.kind for e in events(ctx, r.job_id)]
    assert kinds.count("attempt_failed") == 1 and kinds.count("succeeded") == 1
    # No duplicates: Chroma keeps ids unique by itself, so count what it holds instead. The
    # collection holds this one document; every chunk text is there once, under no other id.
    texts = [
        t
        for page in ctx.vectors.iter_pages(collection(ctx), include=["documents"])
        for t in page["documents"]
    ]
    assert len(texts) == len(set(texts)) == j.chunk_count
    assert j.embedded_count == 0 and j.cached_count == 0  # the second attempt rewrote nothing


def test_kill9_mid_embedding_then_new_worker_and_reaper_finish_the_job(ctx, start_worker):
    from sluice.pipeline.queueing.publishing import publish

    victim = start_worker(
        env={"SLUICE_FAULTS": "embed_batch=sleep:0.4", "SLUICE_EMBED_BATCH_SIZE": "8"},
        name="victim",
    )
    r = ingest_bytes(ctx, LONG, dataset="default", filename="guide.txt", publish=publish)
    wait_until(
        lambda: (lambda j: j.stage.value == "embedding" and j.done >= 24)(job(ctx, r.job_id)),
        60,
        "embedding to be under way",
    )
    at_kill = job(ctx, r.job_id)
    victim.kill9()

    start_worker(env={"SLUICE_EMBED_BATCH_SIZE": "8"}, name="successor")
    [j] = wait_for(ctx, [r.job_id], timeout=90)

    assert j.status.value == "succeeded"
    assert ids_of_job(ctx, r.job_id) == expected_ids(ctx, r)
    lost = [e for e in events(ctx, r.job_id) if e.kind == "attempt_failed"]
    assert len(lost) == 1 and lost[0].data["code"] == "worker_lost" and lost[0].actor == "reaper"
    assert str(victim.pid) in lost[0].message
    # The successor did not embed again what the victim had indexed.
    assert j.embedded_count <= j.chunk_count - at_kill.done + 8


def test_same_job_delivered_twice_at_once_runs_once(ctx, start_worker):
    from sluice.pipeline.queueing.publishing import dispatch_now, publish

    slow = {"SLUICE_FAULTS": "embed_batch=sleep:0.2", "SLUICE_EMBED_BATCH_SIZE": "16"}
    start_worker(env=slow, workers=1, name="a")
    start_worker(env=slow, workers=1, name="b")
    r = ingest_bytes(ctx, LONG, dataset="default", filename="guide.txt")
    # Two deliveries: its outbox row, published once by whichever dispatcher marks it sent (this
    # one, or a worker's, which otherwise made a third delivery), and one more of the same job.
    dispatch_now(ctx.engine)
    publish(r.job_id)

    [j] = wait_for(ctx, [r.job_id], timeout=90)
    wait_until(
        lambda: len([e for e in events(ctx, r.job_id) if e.kind in ("claimed", "noop")]) >= 2,
        30,
        "both deliveries to be handled",
    )

    assert j.status.value == "succeeded"
    evs = events(ctx, r.job_id)
    assert [e.kind for e in evs].count("claimed") == 1
    assert [e.kind for e in evs].count("noop") == 1
    assert ids_of_job(ctx, r.job_id) == expected_ids(ctx, r)


def test_cancel_pending_and_running_jobs_leaves_no_vectors(ctx, start_worker):
    from sqlmodel import Session

    from sluice.pipeline.queueing.publishing import publish
    from sluice.storage import jobs

    pending = ingest_bytes(
        ctx, b"never to be indexed. " * 300, dataset="default", filename="p.txt", publish=publish
    )
    with Session(ctx.engine) as session:
        [res] = jobs.request_cancel(session=session, job_ids=[pending.job_id], actor="test")
    assert res.ok and "before it ran" in res.message

    start_worker(env={"SLUICE_FAULTS": "embed_batch=sleep:0.3", "SLUICE_EMBED_BATCH_SIZE": "8"})
    running = ingest_bytes(ctx, LONG, dataset="default", filename="guide.txt", publish=publish)
    wait_until(
        lambda: (lambda j: j.stage.value == "embedding" and j.done >= 16)(job(ctx, running.job_id)),
        60,
        "embedding to be under way",
    )
    assert ids_of_job(ctx, running.job_id)  # it has written vectors
    with Session(ctx.engine) as session:
        [res] = jobs.request_cancel(session=session, job_ids=[running.job_id], actor="test")
    assert res.ok and "next batch" in res.message

    [j] = wait_for(ctx, [running.job_id], timeout=60)

    assert j.status.value == "cancelled"
    assert j.error_message.startswith("cancelled at embedding ") and j.error_message.endswith(
        " chunks"
    )
    assert ids_of_job(ctx, running.job_id) == []
    # The pending job's message was delivered to the worker, which found it cancelled and never
    # claimed it (a job that never ran has no vectors; what matters is that it was never run).
    wait_until(
        lambda: "noop" in [e.kind for e in events(ctx, pending.job_id)],
        30,
        "the cancelled job's message to be delivered",
    )
    p = job(ctx, pending.job_id)
    assert p.status.value == "cancelled" and p.attempt == 0 and p.lease == 0
    assert "claimed" not in [e.kind for e in events(ctx, pending.job_id)]
