"""Running the same job twice, directly and through a second queue delivery, changes nothing."""

from sluice.ops.ingest import ingest_bytes
from sluice.pipeline.running.runner import run_job
from tests.support.helpers import collection, events, ids_of_job, job, wait_for

TEXT = ("Sluice keeps every job's truth. " * 40 + "\n\n") * 30


def test_second_direct_run_is_a_noop_with_same_ids(ctx):
    r = ingest_bytes(ctx, TEXT.encode(), dataset="default", filename="doc.txt")
    assert run_job(r.job_id, ctx=ctx).result == "succeeded"
    first = ids_of_job(ctx, r.job_id)
    count = ctx.vectors.count(collection(ctx))
    assert len(first) == job(ctx, r.job_id).chunk_count > 1

    again = run_job(r.job_id, ctx=ctx)

    assert again.result == "noop"
    assert ids_of_job(ctx, r.job_id) == first
    assert ctx.vectors.count(collection(ctx)) == count
    kinds = [e.kind for e in events(ctx, r.job_id)]
    assert kinds == ["created", "claimed", "succeeded", "noop"]
    assert "already succeeded" in events(ctx, r.job_id)[-1].message


def test_second_queue_delivery_is_a_noop(ctx, start_worker):
    from sluice.pipeline.queueing.publishing import publish

    start_worker()
    r = ingest_bytes(ctx, TEXT.encode(), dataset="default", filename="doc.txt", publish=publish)
    wait_for(ctx, [r.job_id], timeout=60)
    first = ids_of_job(ctx, r.job_id)

    publish(r.job_id)  # the queue delivers at least once: a duplicate message arrives

    wait_for_event(ctx, r.job_id, "noop")
    assert ids_of_job(ctx, r.job_id) == first
    assert [e.kind for e in events(ctx, r.job_id)].count("claimed") == 1


def wait_for_event(ctx, job_id, kind, timeout=30):
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(e.kind == kind for e in events(ctx, job_id)):
            return
        time.sleep(0.1)
    raise AssertionError(
        f"no {kind} event for job {job_id}: {[e.kind for e in events(ctx, job_id)]}"
    )


def test_rerun_after_reindex_rewrites_nothing_and_drops_stale_ids(ctx):
    """A re-run of the same version keeps the exact ids; ids beyond the new count are deleted."""
    from sqlmodel import Session

    from sluice.storage import jobs
    from sluice.storage.models import Document
    from sluice.storage.vectors import chunk_id

    r = ingest_bytes(ctx, TEXT.encode(), dataset="default", filename="doc.txt")
    run_job(r.job_id, ctx=ctx)
    first = ids_of_job(ctx, r.job_id)
    with Session(ctx.engine) as session:
        doc = session.get(Document, r.document_id)
    # An older run of this job left a chunk beyond today's count.
    stray = chunk_id(doc.sha256, job(ctx, r.job_id).pipeline_version, 999)
    ctx.vectors.add(
        collection(ctx),
        ids=[stray],
        embeddings=ctx.embedder.encode(["stray"]),
        documents=["stray"],
        metadatas=[
            {
                "job_id": r.job_id,
                "document_id": doc.id,
                "pipeline_version": job(ctx, r.job_id).pipeline_version,
                "position": 999,
                "page": 1,
                "filename": "doc.txt",
                "sha256": doc.sha256,
            }
        ],
    )
    with Session(ctx.engine) as session:
        [res] = jobs.reindex(session=session, job_ids=[r.job_id], actor="test")
    assert res.ok, res.message

    assert run_job(r.job_id, ctx=ctx).result == "succeeded"

    assert ids_of_job(ctx, r.job_id) == first
    j = job(ctx, r.job_id)
    assert j.embedded_count == 0 and j.cached_count == 0  # every chunk was already indexed
