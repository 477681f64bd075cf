"""The embedding cache is per dataset: what a job or a preview of dataset A reports as cached never
depends on what dataset B embedded (before: A's job said "N from cache" for chunks only B had
embedded, even after B deleted them, telling A's key what B holds)."""

from __future__ import annotations

from sqlmodel import Session

from sluice.ops.ingest import ingest_bytes
from sluice.ops.preview import count_work
from sluice.pipeline.running.runner import run_job
from sluice.storage.models import Dataset, Document
from tests.support.helpers import events

TEXT = b"The quarterly tariff memo for the northern harbour, with its crane schedule. " * 40


def test_a_dataset_never_reports_another_datasets_embeddings_as_cached(ctx):
    b = ingest_bytes(ctx, TEXT, dataset="team-b", filename="memo.txt")
    assert run_job(b.job_id, ctx=ctx).result == "succeeded"
    a = ingest_bytes(ctx, TEXT, dataset="team-a", filename="memo.txt")
    with Session(ctx.engine) as session:
        doc = session.get(Document, a.document_id)
        collection = session.get(Dataset, doc.dataset_id).collection
    preview = count_work(
        ctx, document=doc, collection=collection, pipeline_version=ctx.pipeline_version
    )
    assert preview.chunks > 0 and preview.cached == 0  # before: every chunk "in the cache"
    assert run_job(a.job_id, ctx=ctx).result == "succeeded"
    [done] = [e for e in events(ctx, a.job_id) if e.kind == "succeeded"]
    assert done.data["cached"] == 0 and "0 from cache" in done.message
    again = ingest_bytes(ctx, TEXT + b"!", dataset="team-a", filename="memo-2.txt")
    with Session(ctx.engine) as session:
        doc2 = session.get(Document, again.document_id)
    mine = count_work(
        ctx, document=doc2, collection=collection, pipeline_version=ctx.pipeline_version
    )
    assert mine.cached > 0  # the dataset's own embeddings still save their work
