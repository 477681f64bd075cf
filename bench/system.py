"""The real system for the benchmark: queue Redis, cache Redis and a Chroma server on free ports,
real huey_consumer workers, and the driver's own Context for uploads and reads.

The driver process sets the SLUICE_* environment for each run (its own data directory, hence its
own SQLite database and blobs), builds a fresh Context from it, and starts workers with the same
environment, exactly as the test suite does.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from tests.support.servers import ChromaServer, Consumer, RedisServer

QUEUE_NAME = f"bench{uuid.uuid4().hex[:8]}"
FINAL = ("succeeded", "failed", "cancelled", "superseded", "deleted")

# The benchmark never reads the developer's .env or SLUICE_* variables (except the test database).
KEEP = ("SLUICE_TEST_DATABASE_URL", "SLUICE_SAMPLES_DIR")


def clean_environment() -> None:
    for key in [k for k in os.environ if k.startswith("SLUICE_") and k not in KEEP]:
        del os.environ[key]
    os.environ.update(
        {
            "SLUICE_ENV_FILE": "",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
        }
    )


def peak_rss_mb(pid: int) -> float:
    """VmHWM of a process: its peak resident set size."""
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def cpu_seconds(pid: int, children: bool = False) -> float:
    """User + system CPU seconds a process has used so far (all its threads); with `children`, also
    those of its children that have ended and been waited for."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11 : 15 if children else 13]) / os.sysconf("SC_CLK_TCK")


def as_epoch(value: datetime) -> float:
    return (value if value.tzinfo else value.replace(tzinfo=UTC)).timestamp()


class Services:
    """Queue and cache Redis and a Chroma server in a temporary folder, for the whole bench run."""

    def __init__(self) -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix="sluice-bench-"))
        self.queue = RedisServer("queue", self.workdir)
        self.cache = RedisServer("cache", self.workdir)
        self.chroma = ChromaServer(self.workdir)
        self.workers: list[Consumer] = []

    def __enter__(self) -> Services:
        for server in (self.queue, self.cache, self.chroma):
            server.start()
        clean_environment()
        os.environ.update(self.base_env())
        return self

    def __exit__(self, *exc) -> None:
        for worker in self.workers:
            worker.stop()
        for server in (self.queue, self.cache, self.chroma):
            server.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def base_env(self) -> dict[str, str]:
        return {
            "SLUICE_QUEUE_REDIS_URL": self.queue.url,
            "SLUICE_CACHE_REDIS_URL": self.cache.url,
            "SLUICE_CHROMA_URL": self.chroma.url,
            "SLUICE_QUEUE_NAME": QUEUE_NAME,
        }

    def configure(self, name: str, **settings: str) -> dict[str, str]:
        """Point this process at a fresh data directory with these settings; return the environment
        for workers. Queue and cache are flushed: no run profits from an earlier one."""
        from sluice.pipeline.running.context import set_context
        from sluice.settings import reset_settings_cache
        from sluice.storage.db import dispose_engines

        for key in [k for k in os.environ if k.startswith("SLUICE_") and k not in KEEP]:
            del os.environ[key]
        os.environ.update(
            {
                "SLUICE_ENV_FILE": "",
                **self.base_env(),
                "SLUICE_DATA_DIR": str(self.workdir / name),
                **settings,
            }
        )
        self.queue.client().flushdb()
        self.cache.client().flushdb()
        reset_settings_cache()
        set_context(None)
        dispose_engines()
        return dict(os.environ)

    def context(self):
        from sluice.pipeline.running.context import Context, set_context
        from sluice.settings import get_settings

        ctx = Context(get_settings())
        set_context(ctx)
        return ctx

    def start_worker(self, env: dict[str, str], name: str, *, workers: int = 2) -> Consumer:
        consumer = Consumer(env, self.workdir / f"{name}.log", workers=workers)
        consumer.start()
        self.workers.append(consumer)
        consumer.wait_ready(self.queue.client(), QUEUE_NAME, timeout=120)
        return consumer

    def stop_worker(self, consumer: Consumer) -> None:
        consumer.stop()
        if consumer in self.workers:
            self.workers.remove(consumer)


@dataclass
class Finished:
    jobs: int
    statuses: dict[str, int]
    chunks: int
    embedded: int
    cached: int
    last_finished: float  # epoch seconds of the last job's finish


def wait_final(ctx, job_ids: list[int], *, timeout: float, poll: float = 0.2) -> Finished:
    """Wait until every job is final; fail loudly with their states after ``timeout``."""
    from sqlalchemy import func
    from sqlmodel import Session, select

    from sluice.storage.models import Job

    deadline = time.monotonic() + timeout
    while True:
        with Session(ctx.engine) as session:
            open_jobs = session.exec(
                select(func.count())
                .select_from(Job)
                .where(Job.id.in_(job_ids), Job.status.notin_(FINAL))
            ).one()
        if open_jobs == 0:
            break
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"{open_jobs} of {len(job_ids)} jobs still open after {timeout:.0f}s"
            )
        time.sleep(poll)
    with Session(ctx.engine) as session:
        rows = session.exec(select(Job).where(Job.id.in_(job_ids))).all()
        statuses: dict[str, int] = {}
        for job in rows:
            statuses[job.status.value] = statuses.get(job.status.value, 0) + 1
        return Finished(
            jobs=len(rows),
            statuses=statuses,
            chunks=sum(j.chunk_count or 0 for j in rows),
            embedded=sum(j.embedded_count for j in rows),
            cached=sum(j.cached_count for j in rows),
            last_finished=max(as_epoch(j.finished_at) for j in rows if j.finished_at),
        )


def warm_up(
    ctx, publish, *, timeout: float = 300, data: bytes | None = None, filename: str = "warmup.txt"
) -> None:
    """One small job through the worker before the clock starts: the model is loaded, the kernels
    warm."""
    from sluice.ops.ingest import ingest_bytes

    if data is None:
        data = (
            "A warm-up document, so that the worker has loaded its model before the measured run. "
            * 30
        ).encode() + uuid.uuid4().hex.encode()
    result = ingest_bytes(ctx, data, dataset="warmup", filename=filename, publish=publish)
    done = wait_final(ctx, [result.job_id], timeout=timeout)
    if done.statuses != {"succeeded": 1}:
        raise RuntimeError(f"warm-up job ended {done.statuses}")
