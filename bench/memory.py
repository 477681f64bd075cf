"""Worker memory: peak RSS (VmHWM) of a fresh huey_consumer that ingests one long PDF, against the
same for a short one. A fresh worker per document, so each peak belongs to that document alone.
"""

from __future__ import annotations

import uuid
from pathlib import Path

from bench.system import Services, peak_rss_mb, wait_final, warm_up


def worker_peak(svc: Services, path: Path, *, settings: dict[str, str]) -> dict:
    env = svc.configure(f"mem-{uuid.uuid4().hex[:6]}", **settings)
    ctx = svc.context()
    from sluice.ops.ingest import ingest_path
    from sluice.pipeline.queueing.publishing import publish

    worker = svc.start_worker(env, "mem", workers=2)
    try:
        warm_up(ctx, publish)
        baseline = peak_rss_mb(worker.pid)
        result = ingest_path(ctx, path, dataset="bench", publish=publish)
        done = wait_final(ctx, [result.job_id], timeout=900)
        if done.statuses != {"succeeded": 1}:
            raise RuntimeError(f"{path.name} ended {done.statuses}")
        return {
            "peak_mb": peak_rss_mb(worker.pid),
            "after_warm_up_mb": baseline,
            "chunks": done.chunks,
        }
    finally:
        svc.stop_worker(worker)
