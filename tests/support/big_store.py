"""A large synthetic store for the reconcile walk: documents and succeeded jobs in the job database,
their chunks in a Chroma collection of its own (tiny vectors: the audit reads ids and metadata
only), a few problems among them, and one traced walk over it.

``tests/test_reconcile.py`` walks a small one and asserts its memory bound;
``bench/reconcile_scale.py`` walks 200,000 chunks and writes its time and peak to BENCHMARKS.md.
"""

from __future__ import annotations

import hashlib
import time
import tracemalloc
from dataclasses import dataclass

import numpy as np
from sqlmodel import Session, select

from sluice.storage.models import Dataset, Document, Job, JobStatus, Stage, utcnow
from sluice.storage.vectors import chunk_id

MISSING = 5  # chunks of document 7 deleted behind the system's back
ALIENS = 2  # chunks nobody made


def synthetic_sha(n: int) -> str:
    return hashlib.sha256(str(n).encode()).hexdigest()


def synthetic_store(
    ctx, *, documents: int, chunks_each: int, dim: int = 2, name: str = "big"
) -> tuple[str, list[Job]]:
    """Documents and succeeded jobs in the database (dataset ``name``), and their chunks in a
    collection of its own; returns (collection, jobs)."""
    version = ctx.pipeline_version
    with Session(ctx.engine) as session:
        ds = Dataset(name=name, collection=f"sluice-{name}-{time.time_ns()}")
        session.add(ds)
        session.commit()
        session.refresh(ds)
        made = []
        for d in range(documents):
            sha = synthetic_sha(d)
            doc = Document(
                dataset_id=ds.id,
                sha256=sha,
                size=1,
                media_type="text/plain",
                filename=f"f{d}.txt",
                blob_key=sha,
            )
            session.add(doc)
            session.flush()
            j = Job(
                document_id=doc.id,
                dataset_id=ds.id,
                filename=doc.filename,
                idempotency_key=f"{ds.id}:{sha}:{version}",
                pipeline_version=version,
                status=JobStatus.succeeded,
                stage=Stage.done,
                chunk_count=chunks_each,
                finished_at=utcnow(),
                lease=1,
            )
            session.add(j)
            session.flush()
            doc.active_job_id = j.id
            made.append((doc.id, sha, j.id))
        session.commit()
        collection = ds.collection
        jobs_made = list(session.exec(select(Job).where(Job.dataset_id == ds.id)).all())
    rng = np.random.default_rng(1)
    batch = 5000
    ids: list[str] = []
    metas: list[dict] = []

    def flush() -> None:
        ctx.vectors.collection(collection).add(
            ids=ids, embeddings=rng.random((len(ids), dim), dtype=np.float32), metadatas=metas
        )
        ids.clear()
        metas.clear()

    for d, (doc_id, sha, jid) in enumerate(made):
        for p in range(chunks_each):
            ids.append(chunk_id(sha, version, p))
            metas.append(
                {
                    "job_id": jid,
                    "document_id": doc_id,
                    "pipeline_version": version,
                    "position": p,
                    "filename": f"f{d}.txt",  # the copy of its document's name a chunk carries
                }
            )
            if len(ids) == batch:
                flush()
    if ids:
        flush()
    return collection, jobs_made


def add_problems(ctx, collection: str, *, dim: int = 2) -> None:
    """A few problems among the chunks, so that the audit has something to find: ``MISSING`` of
    document 7's chunks gone, ``ALIENS`` chunks nobody made."""
    coll = ctx.vectors.collection(collection)
    coll.delete(
        ids=[chunk_id(synthetic_sha(7), ctx.pipeline_version, p) for p in range(10, 10 + MISSING)]
    )
    coll.add(
        ids=[f"alien-{i}" for i in range(1, ALIENS + 1)],
        embeddings=np.ones((ALIENS, dim), dtype=np.float32),
        metadatas=[{"z": 1}] * ALIENS,
    )


@dataclass
class Walk:
    report: object  # a ReconcileReport
    peak: int  # bytes, traced
    seconds: float  # traced: tracing slows Python down, so the time is only a hint


def traced_reconcile(ctx, dataset: str, **kwargs) -> Walk:
    """One reconcile of ``dataset`` (a dry run, not saved), under tracemalloc."""
    from sluice.pipeline.reconcile.audit import reconcile

    started = time.perf_counter()
    tracemalloc.start()
    try:
        report = reconcile(ctx, dataset=dataset, save=False, **kwargs)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return Walk(report, peak, time.perf_counter() - started)
