"""Small helpers shared by tests: waiting for job states, reading jobs and vectors."""

from __future__ import annotations

import threading
import time

from sqlmodel import Session, select

from sluice.storage.models import Dataset, Document, Job, JobEvent, JobStatus

FINAL = {s.value for s in JobStatus.final()}


def job(ctx, job_id: int) -> Job:
    with Session(ctx.engine) as session:
        return session.get(Job, job_id)


def run_file(ctx, data: bytes, filename: str, dataset: str = "default") -> Job:
    """Ingest bytes and run their job in this process, without a queue; the job as it ended."""
    from sluice.ops.ingest import ingest_bytes
    from sluice.pipeline.running.runner import run_job

    r = ingest_bytes(ctx, data, dataset=dataset, filename=filename)
    run_job(r.job_id, ctx=ctx)
    return job(ctx, r.job_id)


def events(ctx, job_id: int, *, progress: bool = False) -> list[JobEvent]:
    """The job's events in order; its ``progress`` events (stage counts, up to two a second while
    it runs, so how many depends on the machine) only when asked."""
    stmt = select(JobEvent).where(JobEvent.job_id == job_id).order_by(JobEvent.id)
    if not progress:
        stmt = stmt.where(JobEvent.kind != "progress")
    with Session(ctx.engine) as session:
        return list(session.exec(stmt).all())


def wait_for(ctx, job_ids, statuses=FINAL, timeout: float = 60.0) -> list[Job]:
    """Wait until every job is in one of ``statuses``; fail with their states if it takes too
    long."""
    statuses = {getattr(s, "value", s) for s in statuses}
    deadline = time.monotonic() + timeout
    while True:
        jobs = [job(ctx, i) for i in job_ids]
        if all(j.status.value in statuses for j in jobs):
            return jobs
        if time.monotonic() > deadline:
            states = {
                j.id: (j.status.value, j.stage.value, j.done, j.total, j.error_message)
                for j in jobs
            }
            raise AssertionError(f"jobs not in {sorted(statuses)} after {timeout}s: {states}")
        time.sleep(0.1)


def make_job(engine, dataset: str, n: int) -> Job:
    """A pending job (with its document, event and outbox row) for made-up bytes number ``n``."""
    from sluice.storage import jobs
    from sluice.storage.db import ensure_dataset

    sha = f"{n:064x}"
    with Session(engine, expire_on_commit=False) as session:
        ds = ensure_dataset(session=session, name=dataset)
        doc = Document(
            dataset_id=ds.id,
            sha256=sha,
            size=10,
            media_type="text/plain",
            filename=f"d{n}.txt",
            blob_key=sha,
        )
        session.add(doc)
        session.flush()
        job, _ = jobs.create_job(
            session=session,
            document=doc,
            pipeline_version="v1",
            idempotency_key=f"{ds.id}:{sha}:v1",
            max_attempts=3,
        )
        session.commit()
        return job


def collection(ctx, name: str = "default") -> str:
    with Session(ctx.engine) as session:
        return session.exec(select(Dataset).where(Dataset.name == name)).one().collection


def ids_of_job(ctx, job_id: int, dataset: str = "default") -> list[str]:
    return sorted(ctx.vectors.ids_where(collection(ctx, dataset), {"job_id": job_id}))


def until(predicate, *, timeout: float, what: str, interval: float = 0.1):
    """Poll ``predicate`` until it returns something truthy; fail saying ``what`` after
    ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what}")
        time.sleep(interval)


class Background(threading.Thread):
    """A test's background thread that never fails silently: ``result()`` joins it within a bound
    and raises whatever the thread raised; ``check()`` raises it at once if the thread already died.
    """

    def __init__(self, target=None, *, name: str | None = None) -> None:
        super().__init__(daemon=True, name=name)
        self._fn = target
        self.error: BaseException | None = None
        self.value = None

    def run(self) -> None:
        try:
            self.value = (self._fn or self.work)()
        except BaseException as exc:  # surfaced by check() and result()
            self.error = exc

    def work(self):  # subclasses override this, or pass target=
        raise NotImplementedError

    def check(self) -> None:
        if self.error is not None:
            raise AssertionError(
                f"background thread {self.name} failed: {self.error!r}"
            ) from self.error

    def result(self, timeout: float = 60.0):
        self.join(timeout)
        if self.is_alive():
            raise AssertionError(f"background thread {self.name} still running after {timeout}s")
        self.check()
        return self.value
