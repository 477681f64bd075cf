"""What one small job costs (issue 31): a first attempt does not read back from Chroma what its own
add just wrote, and it reaches the job database in few statements; a success still means its
chunks are in both stores."""

from __future__ import annotations

from collections import Counter

from sqlalchemy import event

from sluice.ops.ingest import ingest_bytes
from sluice.pipeline.running.runner import run_job
from sluice.storage import lexical
from sluice.storage.models import JobStatus
from tests.support.helpers import collection, ids_of_job, job

NOTE = b"Tide table for the north harbour: high water at 06:12 and 18:40, pilot boarding at buoy 4."

# The claim (one read of the job, its document and dataset and the time; its update and event;
# commit: 4), the held counts written by the first batch's fence (update, event, commit: 3), the
# lexical rows (delete, ownership, insert, commit: 4), the indexing stage done (update, commit: 2; a
# worker dying before its success leaves the job at indexing), the success (the job and its
# document, the document's other jobs, the updates of job and document, its event, commit: 6). The
# code before issue 31 made 30: a pause, the time and the rows read apart, each update read back,
# one more progress write and a lexical delete per batch.
STATEMENT_BUDGET = 19


class ChromaSpy:
    """The vector store, with every call it gets counted."""

    def __init__(self, store) -> None:
        self.store, self.calls = store, Counter()

    def __getattr__(self, name):
        found = getattr(self.store, name)
        if not callable(found):
            return found

        def counted(*args, **kwargs):
            self.calls[name] += 1
            return found(*args, **kwargs)

        return counted


def test_a_first_attempt_writes_its_chunks_without_reading_them_back(database_url, make_ctx):
    ctx = make_ctx()
    r = ingest_bytes(ctx, NOTE, dataset="default", filename="tides.txt")
    store = ctx.vectors
    spy = ChromaSpy(store)
    ctx.__dict__["vectors"] = spy
    try:
        assert run_job(r.job_id, ctx=ctx).result == "succeeded"
    finally:
        ctx.__dict__["vectors"] = store
    assert spy.calls == Counter({"add": 1}), spy.calls  # before: an ids_where after the add too
    j = job(ctx, r.job_id)
    assert j.status == JobStatus.succeeded and j.chunk_count == 1
    assert len(ids_of_job(ctx, r.job_id)) == 1 == lexical.count_job(ctx.engine, r.job_id)


def test_a_small_job_reaches_the_job_database_in_few_statements(database_url, make_ctx):
    # Beats far apart: a heartbeat landing mid-job writes the held counts itself, and the first
    # fence then reads the job's row instead (one statement more, on a busy machine only).
    ctx = make_ctx(SLUICE_HEARTBEAT_SECONDS="30", SLUICE_LEASE_SECONDS="120")
    r = ingest_bytes(ctx, NOTE, dataset="default", filename="tides.txt")
    ctx.vectors.collection(collection(ctx))  # the collection made before counting
    seen: list[str] = []

    def count(conn, cursor, statement, parameters, context, executemany) -> None:
        seen.append(" ".join(statement.split())[:80])

    def commit(conn) -> None:
        seen.append("COMMIT")

    event.listen(ctx.engine, "before_cursor_execute", count)
    event.listen(ctx.engine, "commit", commit)
    try:
        assert run_job(r.job_id, ctx=ctx).result == "succeeded"
    finally:
        event.remove(ctx.engine, "before_cursor_execute", count)
        event.remove(ctx.engine, "commit", commit)
    # before: 25 statements and 5 commits
    assert len(seen) <= STATEMENT_BUDGET, "\n".join(seen)
    # claim, counts, lexical rows, indexing done, success
    assert seen.count("COMMIT") == 5, "\n".join(seen)
    j = job(ctx, r.job_id)
    assert (j.status, j.page_count, j.done, j.total) == (JobStatus.succeeded, 1, 1, 1)
    assert len(ids_of_job(ctx, r.job_id)) == 1 == lexical.count_job(ctx.engine, r.job_id)


def test_a_dispatch_with_nothing_waiting_is_one_statement(database_url, make_ctx):
    """Every claim of a worker dispatches (the next message of the window goes out); mostly
    nothing waits, and then the dispatch is one read (before: the time, the load per dataset and
    the ranking of the due rows, three). A row that waits is still published."""
    from sluice.storage.outbox import dispatch

    ctx = make_ctx()
    published: list[int] = []
    r = ingest_bytes(ctx, NOTE, dataset="default", filename="tides.txt", publish=published.append)
    assert published == [r.job_id]  # the upload's own dispatch sent it: nothing waits now
    seen: list[str] = []

    def count(conn, cursor, statement, parameters, context, executemany) -> None:
        seen.append(" ".join(statement.split())[:80])

    event.listen(ctx.engine, "before_cursor_execute", count)
    try:
        assert dispatch(engine=ctx.engine, publish=published.append, window=8).sent == []
        assert len(seen) == 1, "\n".join(seen)
        later = ingest_bytes(ctx, NOTE + b" again", dataset="default", filename="b.txt")
        seen.clear()
        assert dispatch(engine=ctx.engine, publish=published.append, window=8).sent == [
            later.job_id
        ]
        assert len(seen) > 1
    finally:
        event.remove(ctx.engine, "before_cursor_execute", count)
    assert published == [r.job_id, later.job_id]


def test_a_small_jobs_own_row_is_written_by_statements_made_once(database_url, make_ctx):
    """The claim, the counts and the success's compare-and-set write the job's row with plain
    UPDATEs of the table, made once with bound parameters: the ORM's bulk-update path and the
    building of each statement took about a third of the time a tiny job's thread held the GIL.
    (Other rows, the document's for one, still go through the ORM.)"""
    from sqlmodel import Session

    from sluice.storage import jobs

    ctx = make_ctx(SLUICE_HEARTBEAT_SECONDS="30", SLUICE_LEASE_SECONDS="120")
    first = ingest_bytes(ctx, NOTE, dataset="default", filename="tides.txt")
    assert run_job(first.job_id, ctx=ctx).result == "succeeded"  # every statement made once
    made = {
        "claim": dict(jobs.CLAIMABLE_UNPAUSED.statements),
        "success": dict(jobs.RUNNING_UNCANCELLED.statements),
    }
    writes: list[tuple[str, bool]] = []

    def seen(state) -> None:
        if state.is_update and state.statement.table.name == "job":
            writes.append((str(state.statement).split(" WHERE")[0][:60], state.is_orm_statement))

    r = ingest_bytes(ctx, NOTE + b" Second issue.", dataset="default", filename="tides-2.txt")
    event.listen(Session, "do_orm_execute", seen)
    try:
        assert run_job(r.job_id, ctx=ctx).result == "succeeded"
    finally:
        event.remove(Session, "do_orm_execute", seen)
    # the claim, the held counts with the first fence, indexing done, the success
    assert len(writes) == 4, writes
    assert [w for w, orm in writes if orm] == []  # before: all four went through the ORM
    assert jobs.CLAIMABLE_UNPAUSED.statements == made["claim"]  # the same statements, not new ones
    assert jobs.RUNNING_UNCANCELLED.statements == made["success"]
    j = job(ctx, r.job_id)
    assert (j.status, j.done, j.total, j.attempt) == (JobStatus.succeeded, 1, 1, 1)
