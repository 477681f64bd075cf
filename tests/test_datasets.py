"""Duplicate uploads return the existing job; datasets never leak into each other's search."""

from sluice.ops.ingest import ingest_bytes
from sluice.ops.search import search
from sluice.pipeline.running.runner import run_job
from tests.support.helpers import collection, job

APPLES = b"Apples grow in orchards. Orchard apples ripen in autumn and are picked by hand.\n" * 20
ROCKETS = b"Rockets burn liquid oxygen and kerosene. Rocket engines throttle during ascent.\n" * 20


def test_same_bytes_same_dataset_returns_existing_job(ctx):
    first = ingest_bytes(ctx, APPLES, dataset="default", filename="apples.txt")
    second = ingest_bytes(ctx, APPLES, dataset="default", filename="apples-copy.txt")
    assert first.accepted and not first.duplicate
    assert second.duplicate and second.job_id == first.job_id
    assert f"job {first.job_id}" in second.message
    run_job(first.job_id, ctx=ctx)
    third = ingest_bytes(ctx, APPLES, dataset="default", filename="apples.txt")
    assert third.duplicate and "already indexed" in third.message
    assert ctx.vectors.count(collection(ctx)) == job(ctx, first.job_id).chunk_count


def test_same_file_in_two_datasets_two_jobs_and_no_leaks(ctx):
    a = ingest_bytes(ctx, APPLES, dataset="fruit", filename="apples.txt")
    b = ingest_bytes(ctx, APPLES, dataset="space", filename="apples.txt")
    c = ingest_bytes(ctx, ROCKETS, dataset="space", filename="rockets.txt")
    assert a.job_id != b.job_id
    for r in (a, b, c):
        assert run_job(r.job_id, ctx=ctx).result == "succeeded"
    # one blob for identical bytes
    blobs = [p for p in ctx.blobs.root.rglob("*") if p.is_file()]
    assert len(blobs) == 2

    fruit_hits = search(ctx, query="rocket engines kerosene", dataset="fruit", k=10)
    assert fruit_hits and {h.job_id for h in fruit_hits} == {a.job_id}
    space_hits = search(ctx, query="rocket engines kerosene", dataset="space", k=10)
    assert space_hits[0].filename == "rockets.txt"
    assert {h.job_id for h in space_hits} <= {b.job_id, c.job_id}
