"""Orchestration overhead: many tiny .txt jobs with the hash embedder through the real queue,
database and Chroma, next to Huey's own no-op task rate in the same run.

Sluice's rate is jobs divided by the time from the first claim to the last finish (the worker's
throughput while it has work), after all jobs were created and published at once. Huey's rate is
no-op tasks pushed in one go, divided by the time until the queue is drained. Beside it, the CPU
time the worker process and the Chroma server spent per job from the warm-up's end to the last
finish: the figure a machine shared with other work moves least.
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from pathlib import Path

from bench.system import Services, as_epoch, cpu_seconds, wait_final, warm_up
from tests.support.servers import ManagedProcess

WORDS = (
    "ledger",
    "valve",
    "harbor",
    "signal",
    "quarry",
    "turbine",
    "orchard",
    "beacon",
    "gravel",
    "lantern",
)


def sluice_jobs_per_second(svc: Services, *, jobs: int, workers: int) -> dict:
    env = svc.configure(
        f"orch-{uuid.uuid4().hex[:6]}",
        SLUICE_EMBEDDER="hash",
        SLUICE_RECOVERY_INTERVAL_SECONDS="3600",
    )
    ctx = svc.context()
    from sqlmodel import Session, select

    from sluice.ops.ingest import ingest_bytes
    from sluice.pipeline.queueing.publishing import publish
    from sluice.storage.models import Job
    from sluice.storage.outbox import dispatch

    worker = svc.start_worker(env, "orch", workers=workers)
    try:
        warm_up(ctx, publish)
        cpu_before = cpu_seconds(worker.pid), cpu_seconds(svc.chroma.pid)
        ids = []
        for i in range(jobs):
            text = f"note {i} {uuid.uuid4().hex}: " + " ".join(
                WORDS[(i + k) % len(WORDS)] for k in range(12)
            )
            ids.append(
                ingest_bytes(ctx, text.encode(), dataset="tiny", filename=f"note-{i}.txt").job_id
            )
        sent = 0
        while sent < jobs:
            batch = dispatch(engine=ctx.engine, publish=publish)
            if batch.error:
                raise RuntimeError(batch.error)
            sent += len(batch.sent)
            if not batch.sent and not batch.skipped:
                break
        done = wait_final(ctx, ids, timeout=600)
        worker_cpu = cpu_seconds(worker.pid) - cpu_before[0]
        chroma_cpu = cpu_seconds(svc.chroma.pid) - cpu_before[1]
        if done.statuses != {"succeeded": jobs}:
            raise RuntimeError(f"tiny jobs ended {done.statuses}")
        with Session(ctx.engine) as session:
            first = min(
                as_epoch(s)
                for s in session.exec(select(Job.started_at).where(Job.id.in_(ids))).all()
            )
        seconds = done.last_finished - first
        return {
            "jobs": jobs,
            "seconds": seconds,
            "jobs_per_s": jobs / seconds,
            "ms_per_job": 1000 * seconds / jobs,
            "worker_cpu_ms_per_job": 1000 * worker_cpu / jobs,
            "chroma_cpu_ms_per_job": 1000 * chroma_cpu / jobs,
        }
    finally:
        svc.stop_worker(worker)


def huey_noop_per_second(svc: Services, *, tasks: int, workers: int) -> dict:
    queue = f"noop{uuid.uuid4().hex[:6]}"
    env = {**os.environ, "BENCH_NOOP_REDIS_URL": svc.queue.url, "BENCH_NOOP_QUEUE": queue}
    os.environ.update({"BENCH_NOOP_REDIS_URL": svc.queue.url, "BENCH_NOOP_QUEUE": queue})
    import importlib

    import bench.noop_huey as noop_module

    noop_module = importlib.reload(noop_module)  # bind this run's queue
    huey = noop_module.huey
    exe = str(Path(sys.executable).with_name("huey_consumer"))
    consumer = ManagedProcess(
        [exe, "bench.noop_huey.huey", "-k", "thread", "-w", str(workers), "-d", "0.05"],
        log=svc.workdir / f"{queue}.log",
        env=env,
    )
    consumer.start()
    try:
        conn = huey.storage.conn
        # Wait until the consumer polls the queue: a probe task disappears.
        huey.enqueue(noop_module.noop.s(-1))
        deadline = time.monotonic() + 60
        while conn.llen(huey.storage.queue_key) and time.monotonic() < deadline:
            time.sleep(0.05)
        messages = [huey.serialize_task(noop_module.noop.s(i)) for i in range(tasks)]
        t0 = time.perf_counter()
        conn.lpush(huey.storage.queue_key, *messages)
        while conn.llen(huey.storage.queue_key):
            time.sleep(0.002)
        seconds = time.perf_counter() - t0
        return {
            "tasks": tasks,
            "seconds": seconds,
            "tasks_per_s": tasks / seconds,
            "ms_per_task": 1000 * seconds / tasks,
        }
    finally:
        consumer.stop()
