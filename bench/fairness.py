"""Fairness across datasets: N jobs queued in one dataset, then one upload to another; how long
until the lone job starts, in seconds and in jobs of the big dataset that started before it.

    python -m bench.fairness [--jobs 2000] [--workers 2] [--per-thread 2] [--fifo]

Real huey_consumer, queue Redis, SQLite, Chroma server; the hash embedder (the point is scheduling,
not the model). ``--fifo`` also runs it with the dispatch window off (SLUICE_DISPATCH_PER_THREAD=0:
every job published at once, first in, first out), the way Sluice queued before.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from bench.system import Services


def one_run(svc: Services, *, jobs: int, workers: int, window: int) -> dict:
    from sqlmodel import Session, select

    from sluice.ops.ingest import ingest_bytes
    from sluice.pipeline.queueing.publishing import publish
    from sluice.storage.models import Job, JobEvent

    env = svc.configure(
        f"fair-{window}-{jobs}", SLUICE_EMBEDDER="hash", SLUICE_DISPATCH_PER_THREAD=str(window)
    )
    ctx = svc.context()
    big = [
        ingest_bytes(
            ctx,
            f"big document {n}. ".encode() * 60,
            dataset="big",
            filename=f"b{n}.txt",
            publish=publish,
        ).job_id
        for n in range(jobs)
    ]
    worker = svc.start_worker(env, f"fair-{window}", workers=workers)
    try:
        time.sleep(3)  # the big dataset is under way: the lone upload arrives at a busy queue
        t0 = time.time()
        lone = ingest_bytes(
            ctx, b"the lone document. " * 60, dataset="lone", filename="lone.txt", publish=publish
        ).job_id
        deadline = time.monotonic() + 3600
        while True:
            with Session(ctx.engine) as session:
                job = session.get(Job, lone)
                if job.started_at is not None:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError("the lone job did not start within an hour")
            time.sleep(0.05)
        with Session(ctx.engine) as session:
            started = session.exec(select(Job).where(Job.id == lone)).one().started_at
            lone_claim = session.exec(
                select(JobEvent.id).where(JobEvent.job_id == lone, JobEvent.kind == "claimed")
            ).first()
            since_upload = session.exec(
                select(JobEvent.id).where(JobEvent.job_id == lone, JobEvent.kind == "created")
            ).first()
            ahead = len(
                session.exec(
                    select(JobEvent.id).where(
                        JobEvent.kind == "claimed",
                        JobEvent.job_id != lone,
                        JobEvent.id > since_upload,
                        JobEvent.id < lone_claim,
                    )
                ).all()
            )
            finished = [
                j
                for j in session.exec(
                    select(Job).where(
                        Job.id.in_(big), Job.finished_at.is_not(None), Job.started_at.is_not(None)
                    )
                ).all()
            ]
        durations = [(j.finished_at - j.started_at).total_seconds() for j in finished]
        mean_job = statistics.mean(durations) if durations else float("nan")
        wait = started.timestamp() - t0 if started.tzinfo else time.time() - t0
        return {
            "window": window,
            "jobs": jobs,
            "workers": workers,
            "wait_s": wait,
            "jobs_started_before": ahead,
            "mean_job_s": mean_job,
            "wait_in_jobs": wait / mean_job if durations else None,
        }
    finally:
        svc.stop_worker(worker)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--per-thread", type=int, default=2, help="messages on the queue per worker thread"
    )
    parser.add_argument(
        "--fifo", action="store_true", help="also run with the window off, for comparison"
    )
    args = parser.parse_args(argv)
    runs = []
    with Services() as svc:
        runs.append(one_run(svc, jobs=args.jobs, workers=args.workers, window=args.per_thread))
        if args.fifo:
            runs.append(one_run(svc, jobs=args.jobs, workers=args.workers, window=0))
    for r in runs:
        how = (
            f"{r['window']} messages per thread on the queue" if r["window"] else "no window (FIFO)"
        )
        print(
            f"{r['jobs']} jobs queued in one dataset, {r['workers']} worker threads, {how}: the "
            f"lone job of another dataset started {r['wait_s']:.2f}s after its upload, after "
            f"{r['jobs_started_before']} jobs of the big dataset started (a big job takes "
            f"{r['mean_job_s']:.3f}s; the wait is the time of {r['wait_in_jobs']:.1f} jobs)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
