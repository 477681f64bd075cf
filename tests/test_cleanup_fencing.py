"""The cleanup of an ended attempt is fenced on that attempt: what a cancel, the reaper, a failure
that ends cancelled or a dataset delete removes is only what the attempt of its lease (and those
before it) wrote, and nothing once a later attempt claimed the job. On SQLite and PostgreSQL."""

from __future__ import annotations

import threading

from sqlmodel import Session

from sluice import faults
from sluice.errors import TransientError
from sluice.ops.access import Operator
from sluice.storage import jobs, lexical
from sluice.storage.models import Job, JobStatus
from tests.support.helpers import Background, collection, ids_of_job
from tests.test_races import TEXT

OPERATOR = Operator("fence", "operator", "cli")
BOUND = 60.0  # seconds any wait of these tests may take


def _get(ctx, job_id: int) -> Job:
    with Session(ctx.engine) as session:
        return session.get(Job, job_id)


def retrying_with_chunks(ctx) -> tuple[int, list[str]]:
    """A job whose first attempt wrote some chunks and failed transiently: retrying, chunks left."""
    from sluice.ops.ingest import ingest_bytes
    from sluice.pipeline.running.runner import run_job

    r = ingest_bytes(ctx, TEXT, dataset="default", filename="survey.txt")
    batches: list[int] = []

    def third_batch_fails(**_) -> None:
        batches.append(1)
        if len(batches) == 3:
            raise TransientError("injected_fault", "injected at the third batch", "")

    with faults.hook("embed_batch", third_batch_fails):
        assert run_job(r.job_id, ctx=ctx).result == "retrying"
    written = ids_of_job(ctx, r.job_id)
    assert written, "the first attempt wrote chunks"
    return r.job_id, written


class RetryInTheWindow:
    """Once, at the first of the cancel's cleanup steps it reaches (the ``before_cleanup`` point,
    or the vector delete for a cleanup that has no such point): the operator retries the job, and a
    worker claims it and writes all its chunks, then holds just before its success (the
    ``after_index`` point) until ``release``."""

    def __init__(self, ctx, job_id: int) -> None:
        from sluice.pipeline.running.runner import run_job

        self.ctx, self.job_id, self.done = ctx, job_id, False
        self.reached, self.release = threading.Event(), threading.Event()
        self.worker = Background(lambda: run_job(job_id, ctx=ctx), name="retry")

    def at_index(self, **_) -> None:
        if threading.current_thread() is self.worker:
            self.reached.set()
            assert self.release.wait(BOUND), "never released"

    def __call__(self, **_) -> None:
        if self.done:
            return
        self.done = True
        with Session(self.ctx.engine) as session:
            [res] = jobs.retry(session=session, job_ids=[self.job_id], actor="op")
        assert res.ok, res.message
        self.worker.start()
        while not self.reached.wait(0.1):
            self.worker.check()
            assert self.worker.is_alive(), "the retry ended before it wrote its chunks"


class DeleteSeen:
    """The vector store, but the interleaving runs at the first delete by job (the base tree's
    cleanup has no point of its own between the cancel's commit and its delete)."""

    def __init__(self, store, window: RetryInTheWindow) -> None:
        self.store, self.window = store, window

    def delete(self, name, *, ids=None, where=None):
        if where is not None and threading.current_thread() is not self.window.worker:
            self.window()
        return self.store.delete(name, ids=ids, where=where)

    def __getattr__(self, name):
        return getattr(self.store, name)


def test_a_cancels_cleanup_after_a_retry_claimed_the_job_leaves_the_retrys_chunks(
    database_url, make_ctx
):
    from sluice.ops import actions
    from sluice.ops.search import search

    ctx = make_ctx(SLUICE_EMBED_BATCH_SIZE="2")
    job_id, _ = retrying_with_chunks(ctx)
    cancelled_lease = _get(ctx, job_id).lease
    window = RetryInTheWindow(ctx, job_id)
    store = ctx.vectors
    ctx.__dict__["vectors"] = DeleteSeen(store, window)
    try:
        with faults.hook("after_index", window.at_index), faults.hook("before_cleanup", window):
            report = actions.cancel(OPERATOR, [job_id])  # commits, then its cleanup runs
            assert report.all_ok, [r.message for r in report.results]
            assert window.done, "the retry never ran inside the cancel's window"
            window.release.set()
            outcome = window.worker.result(BOUND)
    finally:
        window.release.set()
        ctx.__dict__["vectors"] = store

    j = _get(ctx, job_id)
    assert (outcome.result, j.status) == ("succeeded", JobStatus.succeeded), j.error_message
    assert j.lease == cancelled_lease + 1
    assert len(ids_of_job(ctx, job_id)) == j.chunk_count > 0  # every chunk of the retry is there
    assert lexical.count_job(ctx.engine, job_id) == j.chunk_count
    for mode in ("dense", "lexical"):
        hits = search(ctx, query="lighthouse survey", dataset="default", k=50, mode=mode)
        assert hits and {h.job_id for h in hits} == {job_id}, mode


def test_a_cleanup_removes_what_its_attempt_wrote_and_nothing_once_another_owns_the_job(
    database_url, make_ctx
):
    from sluice.pipeline.running.cleanup import remove_partial

    ctx = make_ctx(SLUICE_EMBED_BATCH_SIZE="2")
    job_id, written = retrying_with_chunks(ctx)
    ended = _get(ctx, job_id)  # as the attempt ended (lease 1)
    with Session(ctx.engine) as session:  # a later attempt claims it (lease 2)
        assert jobs.claim(session=session, job_id=job_id, worker_id="w2", lease_seconds=30).claimed
    assert remove_partial(ctx, ended) is False
    assert ids_of_job(ctx, job_id) == written

    owner = _get(ctx, job_id)  # the attempt that owns it now may remove what it holds
    assert remove_partial(ctx, owner) is True
    assert ids_of_job(ctx, job_id) == []
    assert ctx.vectors.ids_where(collection(ctx), {"job_id": job_id}) == []
