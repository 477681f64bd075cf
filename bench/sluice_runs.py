"""Sluice itself on the corpus: real huey_consumer, queue Redis, SQLite, Chroma server.

The clock starts at the first upload and stops when the last job has finished (its own
``finished_at``). The worker has run one small warm-up job before, so its model is loaded, as it
is in a running system.
"""

from __future__ import annotations

import time
from pathlib import Path

from bench.system import Services, cpu_seconds, peak_rss_mb, wait_final, warm_up


def ingest_corpus(
    svc: Services,
    paths: list[Path],
    *,
    name: str,
    settings: dict[str, str],
    workers: int = 2,
    timeout: float = 900,
    keep=None,
    warm: Path | None = None,
) -> dict:
    """Ingest ``paths`` into dataset ``bench`` of a fresh data directory. ``keep(ctx, publish,
    job_ids)`` runs after the jobs finished, with the worker still up (the dedupe figure and recall
    use it)."""
    env = svc.configure(name, **settings)
    ctx = svc.context()
    from sluice.ops.ingest import ingest_path
    from sluice.pipeline.queueing.publishing import publish

    worker = svc.start_worker(env, name, workers=workers)
    try:
        if warm is not None:  # a document like the corpus's, not in it
            warm_up(ctx, publish, data=warm.read_bytes(), filename=warm.name)
        else:
            warm_up(ctx, publish)
        cpu0 = cpu_seconds(worker.pid), cpu_seconds(svc.chroma.pid)
        t0 = time.time()
        job_ids = []
        for path in paths:
            result = ingest_path(ctx, path, dataset="bench", publish=publish)
            if not result.accepted:
                raise RuntimeError(f"{path.name} refused: {result.message}")
            job_ids.append(result.job_id)
        done = wait_final(ctx, job_ids, timeout=timeout)
        if done.statuses != {"succeeded": len(job_ids)}:
            raise RuntimeError(f"{name}: jobs ended {done.statuses}")
        out = {
            "seconds": done.last_finished - t0,
            "chunks": done.chunks,
            "jobs": done.jobs,
            "embedded": done.embedded,
            "cached": done.cached,
            "worker_peak_rss_mb": peak_rss_mb(worker.pid),
            "precision": ctx.precision,
            "worker_cpu_s": cpu_seconds(worker.pid) - cpu0[0],
            "chroma_cpu_s": cpu_seconds(svc.chroma.pid) - cpu0[1],
        }
        if keep is not None:
            out.update(keep(ctx, publish, job_ids) or {})
        return out
    finally:
        svc.stop_worker(worker)
        try:
            from sqlmodel import Session

            from sluice.storage.queries import datasets

            with Session(ctx.engine) as session:
                for ds in datasets(session=session):
                    ctx.vectors.drop_collection(ds.collection)
        except Exception:
            pass


def recall_ranks(ctx, facts, *, dataset: str = "bench", k: int = 10) -> list[int | None]:
    """For each known-answer query: rank (0-based) of the first hit containing the fact's name."""
    from sluice.ops.search import search

    ranks: list[int | None] = []
    for fact in facts:
        hits = search(
            ctx, query=fact.query, dataset=dataset, k=k, mode="dense"
        )  # the model against the peer's
        ranks.append(next((i for i, h in enumerate(hits) if fact.name in h.text), None))
    return ranks


def recall_at(ranks: list[int | None], k: int) -> float:
    return sum(1 for r in ranks if r is not None and r < k) / max(1, len(ranks))
