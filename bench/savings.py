"""Dedupe and retry savings.

Dedupe: the time to answer a re-upload of a file that is already indexed (through the same
``ingest_path`` the CLI and console use), and proof that it embedded nothing and queued nothing.

Retry: a worker dies (``os._exit``, like kill -9) right after the embedding batch at 90% of a
document; a fresh worker takes the job back after the lease; the figure is how many chunks the
second attempt embedded again although the first attempt had embedded them already.
"""

from __future__ import annotations

import math
import time
import uuid
from pathlib import Path

from bench.system import Services, wait_final


def dedupe_answer(ctx, publish, paths: list[Path], *, repeats: int) -> dict:
    """Re-upload already indexed files; milliseconds per answer, and what it cost downstream."""
    from sqlmodel import Session, select

    from sluice.ops.ingest import ingest_path
    from sluice.pipeline.queueing.broker import queue_depth
    from sluice.storage.models import Job

    def embedded_total() -> int:
        with Session(ctx.engine) as session:
            return sum(session.exec(select(Job.embedded_count)).all())

    before_jobs = _job_count(ctx)
    before_embedded = embedded_total()
    before_queue = queue_depth()["queued"]
    times = []
    for i in range(repeats):
        path = paths[i % len(paths)]
        t0 = time.perf_counter()
        result = ingest_path(ctx, path, dataset="bench", publish=publish)
        times.append((time.perf_counter() - t0) * 1000)
        if not (result.accepted and result.duplicate and result.status == "succeeded"):
            raise RuntimeError(
                f"re-upload of {path.name} was not answered as a duplicate: {result}"
            )
    return {
        "ms": times,
        "new_jobs": _job_count(ctx) - before_jobs,
        "embedded": embedded_total() - before_embedded,
        "queued": queue_depth()["queued"] - before_queue,
        "bytes": [p.stat().st_size for p in paths],
    }


def _job_count(ctx) -> int:
    from sqlalchemy import func
    from sqlmodel import Session, select

    from sluice.storage.models import Job

    with Session(ctx.engine) as session:
        return session.exec(select(func.count()).select_from(Job)).one()


FAST_RECOVERY = {
    "SLUICE_LEASE_SECONDS": "3",
    "SLUICE_HEARTBEAT_SECONDS": "0.5",
    "SLUICE_RECOVERY_INTERVAL_SECONDS": "0.5",
    "SLUICE_RETRY_BASE_SECONDS": "0.2",
    "SLUICE_RETRY_MAX_SECONDS": "1",
}


def crash_at_90(svc: Services, path: Path, *, chunks: int, settings: dict[str, str]) -> dict:
    """Kill the worker after the batch at 90% of ``path`` (``chunks`` chunks), retry, count
    re-embeds."""
    batch = int(settings.get("SLUICE_EMBED_BATCH_SIZE", "32"))
    batches = math.ceil(chunks / batch)
    crash_batch = max(1, int(0.9 * batches))  # after batch 9 of 10: 90% of the chunks are embedded
    env = svc.configure(f"crash-{uuid.uuid4().hex[:6]}", **FAST_RECOVERY, **settings)
    ctx = svc.context()
    from sluice.ops.ingest import ingest_path
    from sluice.pipeline.queueing.publishing import publish

    doomed = svc.start_worker(
        {**env, "SLUICE_FAULTS": f"embed_batch@{crash_batch}=exit"}, "crash-a", workers=1
    )
    survivor = None
    try:
        result = ingest_path(ctx, path, dataset="bench", publish=publish)
        deadline = time.monotonic() + 600
        while doomed.alive():
            if time.monotonic() > deadline:
                raise TimeoutError("the worker did not reach the crash point")
            time.sleep(0.1)
        survivor = svc.start_worker(env, "crash-b", workers=1)
        done = wait_final(ctx, [result.job_id], timeout=600)
        if done.statuses != {"succeeded": 1}:
            raise RuntimeError(f"crashed job ended {done.statuses}")
        from sqlmodel import Session

        from sluice.storage.models import Job

        with Session(ctx.engine) as session:
            job = session.get(Job, result.job_id)
        first_attempt = min(
            done.chunks, crash_batch * batch
        )  # embedded and written before the crash
        return {
            "chunks": done.chunks,
            "batches": batches,
            "crash_batch": crash_batch,
            "attempts": job.attempt,
            "second_embedded": job.embedded_count,
            "second_cached": job.cached_count,
            "re_embedded": max(0, job.embedded_count - (done.chunks - first_attempt)),
        }
    finally:
        svc.stop_worker(doomed)
        if survivor is not None:
            svc.stop_worker(survivor)
