"""What one small job costs (issue 31): a first attempt does not read back from Chroma what its own
add just wrote, and it reaches the job database in few statements; a success still means its
chunks are in both stores."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import httpx
from sqlalchemy import event
from sqlmodel import Session, select

from sluice.ops.ingest import ingest_bytes
from sluice.pipeline.running.runner import run_job
from sluice.storage import lexical
from sluice.storage.models import Document, Job, JobEvent, JobStatus, Outbox
from tests.support.api_server import ApiServer, auth, make_key
from tests.support.helpers import collection, ids_of_job, job, until, wait_for

NOTE = b"Tide table for the north harbour: high water at 06:12 and 18:40, pilot boarding at buoy 4."

# The claim (one read of the job, its document and dataset and the time; its update and event;
# commit: 4), the held counts written by the first batch's fence (update, event, commit: 3), the
# lexical rows (delete, ownership, insert, commit: 4), the indexing stage done (update, commit: 2; a
# worker dying before its success leaves the job at indexing), the success (the job and its
# document, the document's other jobs, the updates of job and document, its event, commit: 6). The
# code before issue 31 made 30: a pause, the time and the rows read apart, each update read back,
# one more progress write and a lexical delete per batch. Since issue 43 the claim also marks the
# job's message taken (the outbox rows in flight, one UPDATE), and the success reads the document's
# other jobs only when its first read says there are any (one SELECT less): still 19.
STATEMENT_BUDGET = 19

# An upload's rows: its dataset read by name and then held (2), whether the bytes have a document
# (1), then document, job, event and outbox row, one INSERT each (4), and the commit. Before: 11
# (the job looked up by its key, the database's time, an UPDATE of an outbox row a new job cannot
# have), all of them flushed through the ORM's unit of work.
UPLOAD_STATEMENT_BUDGET = 8
ROWS = (Document, Job, JobEvent, Outbox)


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


def _counted(engine, seen: list[str]):
    """Listeners that append each statement of ``engine`` (and COMMIT) to ``seen``."""

    def count(conn, cursor, statement, parameters, context, executemany) -> None:
        seen.append(" ".join(statement.split())[:80])

    def commit(conn) -> None:
        seen.append("COMMIT")

    return [(engine, "before_cursor_execute", count), (engine, "commit", commit)]


def test_an_upload_writes_its_rows_by_statements_made_once(database_url, make_ctx):
    """Document, job, event and outbox row are one INSERT each, made once, and none goes through
    the ORM's unit of work: building, flushing and keying them was most of an upload's time in the
    API (issue 43)."""
    ctx = make_ctx()
    ingest_bytes(ctx, NOTE, dataset="default", filename="tides.txt")  # every statement made once
    flushed: list[str] = []

    def inserted(mapper, connection, target) -> None:
        flushed.append(type(target).__name__)

    seen: list[str] = []
    listeners = [*_counted(ctx.engine, seen), *((m, "before_insert", inserted) for m in ROWS)]
    for target, name, fn in listeners:
        event.listen(target, name, fn)
    try:
        r = ingest_bytes(ctx, NOTE + b" Second issue.", dataset="default", filename="tides-2.txt")
    finally:
        for target, name, fn in listeners:
            event.remove(target, name, fn)
    assert r.accepted and not r.duplicate
    assert flushed == []  # before: Document, Job, JobEvent and Outbox, each flushed
    assert len(seen) <= UPLOAD_STATEMENT_BUDGET, "\n".join(seen)  # before: 11
    assert seen.count("COMMIT") == 1, "\n".join(seen)
    with Session(ctx.engine) as session:
        [row] = session.exec(select(Outbox).where(Outbox.job_id == r.job_id)).all()
        kinds = session.exec(select(JobEvent.kind).where(JobEvent.job_id == r.job_id)).all()
    assert row.sent_at is None and row.available_at is not None and row.dataset_id is not None
    assert kinds == ["created"]
    j = job(ctx, r.job_id)
    assert (j.status, j.document_id, j.version) == (JobStatus.pending, r.document_id, 0)
    again = ingest_bytes(ctx, NOTE + b" Second issue.", dataset="default", filename="copy.txt")
    assert again.duplicate and again.job_id == r.job_id  # the same bytes: the same job


def test_a_small_job_runs_without_the_orm(database_url, make_ctx):
    """Every statement a tiny job's run makes through a session is a plain statement made once:
    its events are INSERTs (before: ``JobEvent`` objects flushed through the unit of work, three
    per job) and its reads of the job, document and dataset one SELECT of their columns (before:
    an ORM select of the three entities, twice)."""
    ctx = make_ctx(SLUICE_HEARTBEAT_SECONDS="30", SLUICE_LEASE_SECONDS="120")
    first = ingest_bytes(ctx, NOTE, dataset="default", filename="tides.txt")
    assert run_job(first.job_id, ctx=ctx).result == "succeeded"
    r = ingest_bytes(ctx, NOTE + b" Second issue.", dataset="default", filename="tides-2.txt")
    orm: list[str] = []
    flushed: list[str] = []

    def executed(state) -> None:
        if state.is_orm_statement:
            orm.append(str(state.statement)[:60])

    def written(mapper, connection, target) -> None:
        flushed.append(type(target).__name__)

    listeners = [(Session, "do_orm_execute", executed)]
    listeners += [(m, kind, written) for m in ROWS for kind in ("before_insert", "before_update")]
    for target, name, fn in listeners:
        event.listen(target, name, fn)
    try:
        assert run_job(r.job_id, ctx=ctx).result == "succeeded"
    finally:
        for target, name, fn in listeners:
            event.remove(target, name, fn)
    assert flushed == []  # before: three JobEvents (claimed, progress, succeeded)
    assert orm == []  # before: the claim's and the success's read of the job
    with Session(ctx.engine) as session:
        kinds = session.exec(
            select(JobEvent.kind).where(JobEvent.job_id == r.job_id).order_by(JobEvent.id)
        ).all()
    assert kinds == ["created", "claimed", "progress", "succeeded"]


def _api_held_at_dispatch(tmp_path: Path) -> tuple[ApiServer, Path]:
    """A real API process whose dispatcher thread stops at ``upload_dispatch`` until the file it
    names exists (the request threads never reach that point)."""
    hold = tmp_path / "dispatch"
    env = {**os.environ, "SLUICE_FAULTS": f"upload_dispatch=wait:{hold}"}
    api = ApiServer(env, tmp_path / "api.log")
    api.start()
    return api, hold


def _upload(api: ApiServer, token: str, text: str) -> int:
    r = httpx.post(
        f"{api.url}/v1/datasets/default/documents",
        json={"filename": "tides.txt", "text": text},
        headers=auth(token),
        timeout=30,
    )
    assert r.status_code == 202, r.text
    return r.json()["jobs"][0]["job_id"]


def _outbox_of(ctx, job_id: int) -> list[Outbox]:
    with Session(ctx.engine) as session:
        return list(session.exec(select(Outbox).where(Outbox.job_id == job_id)).all())


def test_an_upload_answers_before_its_job_is_published_and_the_dispatcher_publishes_it(
    database_url, make_ctx, tmp_path
):
    """The request commits the job with its outbox row and answers; the API's dispatcher thread
    puts it on the queue after that (the queue's round trip was a quarter of an upload's time in
    the request). Held at its fault point, the dispatcher has been woken by the commit while the
    answer is already out and the job not yet on the queue; let go, it publishes the job.
    Before: the request published the job itself, and no dispatcher ever reached the point."""
    from sluice.pipeline.queueing.broker import queue_order

    ctx = make_ctx()
    api, hold = _api_held_at_dispatch(tmp_path)
    try:
        token = make_key("uploads", datasets=["default"], scope="ingest")
        job_id = _upload(api, token, NOTE.decode())
        waiting = Path(f"{hold}.waiting")
        until(waiting.exists, timeout=30, what="the dispatcher woken by the upload's commit")
        [row] = _outbox_of(ctx, job_id)
        assert row.sent_at is None and job_id not in queue_order()  # not by the request
        hold.touch()
        until(lambda: job_id in queue_order(), timeout=30, what="the job on the queue")
        [row] = _outbox_of(ctx, job_id)
        assert row.sent_at is not None and row.in_flight
    finally:
        api.stop()


def test_an_upload_whose_api_dies_before_the_dispatch_still_runs(
    database_url, make_ctx, tmp_path, start_worker
):
    """The outbox row commits with the job, so a crash between the upload's commit and the
    dispatch loses nothing: the workers' recovery publishes the unsent row and the job runs once.
    Before: no dispatcher ever reached the fault point the crash is placed at."""
    ctx = make_ctx()
    api, hold = _api_held_at_dispatch(tmp_path)
    try:
        token = make_key("uploads", datasets=["default"], scope="ingest")
        job_id = _upload(api, token, NOTE.decode())
        waiting = Path(f"{hold}.waiting")
        until(waiting.exists, timeout=30, what="the dispatcher woken by the upload's commit")
        api.kill9()  # committed, answered, never published
    finally:
        api.stop()
    [row] = _outbox_of(ctx, job_id)
    assert row.sent_at is None
    start_worker()  # its recovery round publishes what no dispatcher sent
    [done] = wait_for(ctx, [job_id], timeout=90)
    assert done.status == JobStatus.succeeded and done.attempt == 1
    with Session(ctx.engine) as session:
        claims = session.exec(
            select(JobEvent).where(JobEvent.job_id == job_id, JobEvent.kind == "claimed")
        ).all()
    assert len(claims) == 1
