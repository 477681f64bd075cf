"""Interleavings of the operator's operations with the job engine (dataset settings, unlock,
delete, prune, the recovery grace, webhooks), forced with hooks and fault points, on SQLite and
PostgreSQL; tests/test_races.py holds those of the job engine alone.

Issue 25's nine confirmed races, one test each (numbered as in the issue), then its suspected ones.
Every test pins the window with a hook; none sleeps.
"""

from __future__ import annotations

import threading
from datetime import timedelta

import httpx
import pytest
from sqlalchemy import update
from sqlmodel import Session, select

from sluice import faults
from sluice.ops import settings_changes
from sluice.ops.ingest import ingest_bytes
from sluice.pipeline.running.runner import run_job
from sluice.storage import jobs, lexical
from sluice.storage.models import (
    Dataset,
    Document,
    ErrorKind,
    Instance,
    Job,
    JobStatus,
    Outbox,
    WebhookDelivery,
)
from tests.support.helpers import Background, collection, events, ids_of_job
from tests.test_jobstore import LEASE, claim, fail, get, new_job

TEXT = "".join(
    f"Paragraph {i} of the survey describes the lighthouse number {i} in its own words. " * 10
    + "\n\n"
    for i in range(12)
).encode()


def document_of(ctx, job_id: int) -> Document:
    with Session(ctx.engine) as session:
        return session.get(Document, get(ctx.engine, job_id).document_id)


def served(ctx, document_id: int, dataset: str = "default") -> tuple[Job | None, list[dict]]:
    """The document's active job and the metadata of every chunk search may return for it."""
    with Session(ctx.engine) as session:
        doc = session.get(Document, document_id)
        active = session.get(Job, doc.active_job_id) if doc.active_job_id else None
    if active is None:
        return None, []
    pages = ctx.vectors.iter_pages(
        collection(ctx, dataset), where={"job_id": active.id}, include=["metadatas"]
    )
    return active, [m for page in pages for m in page["metadatas"]]


def assert_serves_one_version(ctx, document_id: int, dataset: str = "default") -> None:
    active, metas = served(ctx, document_id, dataset)
    assert active is not None
    versions = {m["pipeline_version"] for m in metas}
    assert versions == {active.pipeline_version}, (active.pipeline_version, versions)
    assert len(metas) == active.chunk_count == lexical.count_job(ctx.engine, active.id)


def run_until_quiet(ctx, rounds: int = 6) -> None:
    """Run every waiting job in this thread until none is left (a bounded number of rounds)."""
    for _ in range(rounds):
        with Session(ctx.engine) as session:
            waiting = session.exec(
                select(Job.id).where(Job.status.in_(jobs.CLAIMABLE)).order_by(Job.id)
            ).all()
            session.execute(update(Job).values(next_attempt_at=None))
            session.commit()
        if not waiting:
            return
        for job_id in waiting:
            run_job(job_id, ctx=ctx)
    with Session(ctx.engine) as session:
        left = session.exec(select(Job).where(Job.status.in_(jobs.CLAIMABLE))).all()
        said = {
            j.id: (j.status.value, j.error_code, j.error_message, (j.error_detail or "")[-1500:])
            for j in left
        }
    if said:  # the last round may have run the last of them (it raised then, with nothing left)
        raise AssertionError(f"jobs still waiting after the rounds: {said}")


def cancel_at_batch(ctx, n: int = 1):
    """A hook for ``embed_batch``: the operator cancels the running job at its n-th batch."""
    seen: list[int] = []

    def hook(**_) -> None:
        seen.append(1)
        if len(seen) != n:
            return
        with Session(ctx.engine) as session:
            running = session.exec(select(Job.id).where(Job.status == JobStatus.running)).all()
            jobs.request_cancel(session=session, job_ids=running, actor="op")

    return hook


# --- 1. a settings change never re-versions a document's active job -------------------------------


def test_1_a_settings_change_leaves_a_queued_rebuild_of_the_served_job_on_its_version(
    database_url, make_ctx
):
    ctx = make_ctx(SLUICE_EMBED_BATCH_SIZE="4")
    first = ingest_bytes(ctx, TEXT, dataset="default", filename="survey.txt")
    assert run_job(first.job_id, ctx=ctx).result == "succeeded"
    with Session(ctx.engine) as session:  # a rebuild of what the document serves is queued ...
        assert jobs.reindex(session=session, job_ids=[first.job_id], actor="op")[0].ok
    change = settings_changes.apply(
        ctx, "default", {"chunk_size": "300", "chunk_overlap": "30"}, actor="op"
    )
    assert change.ok, change.message  # ... when the dataset's settings change

    with faults.hook("embed_batch", cancel_at_batch(ctx)):  # the new build is cancelled midway
        run_until_quiet(ctx)
    assert_serves_one_version(ctx, first.document_id)

    from sluice.pipeline.reconcile.audit import reconcile

    reconcile(ctx, repair=True, actor="test")
    assert_serves_one_version(ctx, first.document_id)
    run_until_quiet(ctx)  # the rebuild a repair or a retry queues builds the version in force
    with Session(ctx.engine) as session:
        assert jobs.retry(
            session=session,
            job_ids=[j.id for j in session.exec(select(Job)) if j.status == JobStatus.cancelled],
            actor="op",
        )
    run_until_quiet(ctx)
    assert_serves_one_version(ctx, first.document_id)
    active, _ = served(ctx, first.document_id)
    assert active.pipeline_version == change.to_version


# --- 2. unlock, delete, re-upload the locked file -------------------------------------------------


def test_2_a_locked_file_uploaded_again_after_unlock_and_delete_is_indexable(
    database_url, make_ctx
):
    from sluice.ops.documents import delete_document
    from sluice.ops.unlock import unlock_and_retry
    from tests.test_passwords import locked_pdf

    ctx = make_ctx()
    locked = locked_pdf("sesame")
    r = ingest_bytes(ctx, locked, dataset="default", filename="ledger.pdf")
    assert run_job(r.job_id, ctx=ctx).result == "failed"
    assert unlock_and_retry(ctx, r.job_id, "sesame", actor="op").ok
    assert run_job(r.job_id, ctx=ctx).result == "succeeded"
    assert delete_document(ctx, r.job_id, actor="op").ok

    again = ingest_bytes(ctx, locked, dataset="default", filename="ledger.pdf")
    assert again.accepted and again.job_id == r.job_id
    outcome = run_job(r.job_id, ctx=ctx)
    j = get(ctx.engine, r.job_id)
    assert j.error_code == "password_protected", (outcome, j.error_code, j.error_message)
    assert unlock_and_retry(ctx, r.job_id, "sesame", actor="op").ok
    assert run_job(r.job_id, ctx=ctx).result == "succeeded"


# --- 3. no job waits for a pipeline version that no worker of its dataset makes -------------------


@pytest.mark.parametrize("ending", ["transient", "reaped"])
def test_3_a_job_running_when_its_datasets_settings_change_builds_the_new_version(
    database_url, make_ctx, ending
):
    ctx = make_ctx()
    r = ingest_bytes(ctx, TEXT, dataset="default", filename="survey.txt")
    lease = claim(ctx.engine, r.job_id).job.lease  # a worker has it ...
    change = settings_changes.apply(ctx, "default", {"chunk_size": "300"}, actor="op")
    assert change.ok and not change.restamped  # ... running, so the change leaves it alone
    if ending == "transient":
        assert fail(ctx.engine, r.job_id, lease, ErrorKind.transient).status == JobStatus.retrying
    else:
        with Session(ctx.engine) as session:
            job = session.get(Job, r.job_id)
            job.heartbeat_at -= timedelta(seconds=ctx.settings.lease_seconds * 2)
            session.add(job)
            session.commit()
            assert jobs.reap(
                session=session,
                lease_seconds=ctx.settings.lease_seconds,
                base_delay=0.01,
                max_delay=0.02,
            ) == [r.job_id]

    run_until_quiet(ctx, rounds=2)
    active, _ = served(ctx, r.document_id)
    assert active is not None and active.pipeline_version == change.to_version
    assert_serves_one_version(ctx, r.document_id)
    with Session(ctx.engine) as session:
        assert all(
            j.status in JobStatus.final() for j in session.exec(select(Job)).all()
        )  # nothing is left waiting for a worker of the old version


# --- 4. a waiting job always has a way forward: prune never takes its outbox ----------------------


def _superseded_job(ctx) -> int:
    """A document whose first job was superseded by a job of another version, long ago."""
    engine = ctx.engine
    old = new_job(engine, 1)
    succeed_now(engine, old, claim(engine, old).job.lease)
    with Session(engine, expire_on_commit=False) as session:
        doc = session.get(Document, get(engine, old).document_id)
        newer, _ = jobs.create_job(
            session=session,
            document=doc,
            pipeline_version="vnew",
            idempotency_key=f"{doc.dataset_id}:{doc.sha256}:vnew",
            max_attempts=3,
        )
        session.commit()
    succeed_now(engine, newer.id, claim(engine, newer.id).job.lease)
    assert get(engine, old).status == JobStatus.superseded
    return old


def succeed_now(engine, job_id: int, lease: int) -> None:
    with Session(engine) as session:
        jobs.succeed(
            session=session,
            job_id=job_id,
            lease=lease,
            worker_id="w",
            built=jobs.Built(chunks=1, pages=1, embedded=1, cached=0),
        )


def prune(engine, days: float = 1.0, future: float = 10.0):
    """Prune with the clock moved ``future`` days on (everything looks old)."""
    from sluice.storage import retention
    from sluice.storage.clock import db_now

    with Session(engine) as session:
        cutoff = db_now(session) + timedelta(days=future - days)
        return retention.prune(session=session, cutoff=cutoff, dry_run=False)


def test_4_a_prune_racing_a_revive_keeps_the_revived_jobs_outbox_and_history(
    database_url, make_ctx
):
    ctx = make_ctx()
    old = _superseded_job(ctx)

    def settings_changed_back(**_) -> None:
        with Session(ctx.engine) as session:
            assert jobs.revive(session=session, job_ids=[old], actor="op")[0].ok

    with faults.hook("prune_selected", settings_changed_back):
        prune(ctx.engine)
    j = get(ctx.engine, old)
    assert j is not None and j.status == JobStatus.pending
    with Session(ctx.engine) as session:
        rows = session.exec(select(Outbox).where(Outbox.job_id == old)).all()
    assert [r.sent_at for r in rows] == [None]  # it will be published
    assert "revived" in [e.kind for e in events(ctx, old)]


def test_4_a_waiting_job_whose_published_row_was_pruned_is_still_found_stranded(
    database_url, make_ctx
):
    from sluice.storage.outbox import dispatch, redeliver_stranded

    ctx = make_ctx()
    job_id = new_job(ctx.engine, 1)
    assert dispatch(engine=ctx.engine, publish=lambda _id: None).sent == [job_id]
    prune(ctx.engine)  # its message is lost later: only the database knows the job waits
    with Session(ctx.engine) as session:
        assert session.exec(select(Outbox)).all() == []
        job = session.get(Job, job_id)
        job.updated_at -= timedelta(days=30)
        session.add(job)
        session.commit()
        found = redeliver_stranded(session=session, older_than_seconds=60, queued_job_ids=set())
    assert found == [job_id]


# --- 5. a delete racing an upload of the same bytes keeps the new upload's file -------------------


def test_5_a_delete_racing_an_upload_of_the_same_bytes_elsewhere_keeps_the_file(
    database_url, make_ctx
):
    from sluice.ops.documents import delete_document

    ctx = make_ctx()
    first = ingest_bytes(ctx, TEXT, dataset="default", filename="survey.txt")
    uploads = []

    def the_same_bytes_arrive_elsewhere(**_) -> None:
        uploads.append(ingest_bytes(ctx, TEXT, dataset="beta", filename="survey.txt"))

    with faults.hook("blob_unused", the_same_bytes_arrive_elsewhere):
        assert delete_document(ctx, first.job_id, actor="op").ok
    [second] = uploads
    assert second.accepted and not second.duplicate
    assert run_job(second.job_id, ctx=ctx).result == "succeeded", get(
        ctx.engine, second.job_id
    ).error_message


def test_5_an_upload_that_commits_after_the_deletes_last_look_keeps_the_file(
    database_url, make_ctx
):
    from sluice.ops.documents import delete_document

    ctx = make_ctx()
    first = ingest_bytes(ctx, TEXT, dataset="default", filename="survey.txt")
    deleted = []

    def the_delete_runs_before_the_upload_commits(**_) -> None:
        if not deleted:  # the upload stored its bytes and has not written its document yet
            deleted.append(delete_document(ctx, first.job_id, actor="op"))

    with faults.hook("before_document_insert", the_delete_runs_before_the_upload_commits):
        second = ingest_bytes(ctx, TEXT, dataset="beta", filename="survey.txt")
    assert deleted[0].ok and second.accepted
    assert run_job(second.job_id, ctx=ctx).result == "succeeded", get(
        ctx.engine, second.job_id
    ).error_message


# --- 6. the recovery grace notices a second outage ------------------------------------------------


def test_6_a_second_silence_within_the_grace_holds_the_reaping_again(
    database_url, make_ctx, monkeypatch
):
    from sluice.pipeline.queueing import recovery

    ctx = make_ctx()
    recovery.run_once(ctx, publish=lambda _id: None)  # a tick: the database answers
    alive = new_job(ctx.engine, 1)
    claim(ctx.engine, alive)

    def silence() -> None:  # no reaper ticks (the database is down), and no heartbeat lands
        with Session(ctx.engine) as session:
            row = session.exec(select(Instance)).one()
            row.reaper_tick_at -= timedelta(seconds=recovery.silence_seconds(ctx.settings) + 1)
            session.add(row)
            job = session.get(Job, alive)
            job.heartbeat_at -= timedelta(seconds=ctx.settings.lease_seconds * 2)
            session.add(job)
            session.commit()

    clock = [1000.0]
    monkeypatch.setattr(recovery, "_monotonic", lambda: clock[0])
    monkeypatch.setattr(recovery, "_sleep", lambda s: pytest.fail(f"waited {s}s in line"))
    hold = recovery.ReapHold()
    silence()
    first = recovery.run_once(ctx, publish=lambda _id: None, hold=hold)
    assert first.reaped == [] and first.reap_held_seconds > 0
    with Session(ctx.engine) as session:  # the live worker beats within the grace ...
        assert jobs.heartbeat(session=session, job_id=alive, lease=get(ctx.engine, alive).lease)
    clock[0] += first.reap_held_seconds / 2
    assert recovery.run_once(ctx, publish=lambda _id: None, hold=hold).reaped == []
    silence()  # ... then a second outage, longer than a lease
    clock[0] += first.reap_held_seconds  # the first hold is over
    assert recovery.run_once(ctx, publish=lambda _id: None, hold=hold).reaped == []
    j = get(ctx.engine, alive)
    assert (j.status, j.attempt) == (JobStatus.running, 1)


def test_6_a_one_shot_round_asks_again_after_its_wait(database_url, make_ctx, monkeypatch):
    from sluice.pipeline.queueing import recovery

    ctx = make_ctx()
    recovery.run_once(ctx, publish=lambda _id: None)
    alive = new_job(ctx.engine, 1)
    claim(ctx.engine, alive)

    def silence() -> None:
        with Session(ctx.engine) as session:
            row = session.exec(select(Instance)).one()
            row.reaper_tick_at -= timedelta(seconds=recovery.silence_seconds(ctx.settings) + 1)
            session.add(row)
            job = session.get(Job, alive)
            job.heartbeat_at -= timedelta(seconds=ctx.settings.lease_seconds * 2)
            session.add(job)
            session.commit()

    waits = []

    def a_second_outage_during_the_wait(seconds: float) -> None:
        waits.append(seconds)
        if len(waits) == 1:
            silence()
        else:  # the live worker beats in the second grace
            with Session(ctx.engine) as session:
                lease = get(ctx.engine, alive).lease
                assert jobs.heartbeat(session=session, job_id=alive, lease=lease)

    monkeypatch.setattr(recovery, "_sleep", a_second_outage_during_the_wait)
    silence()
    assert recovery.run_once(ctx, publish=lambda _id: None).reaped == []
    assert len(waits) == 2 and get(ctx.engine, alive).status == JobStatus.running


# --- 7. unlock racing a plain retry ---------------------------------------------------------------


def test_7_an_unlock_racing_a_plain_retry_ends_indexed_and_says_so(database_url, make_ctx):
    from sluice.ops.unlock import unlock_and_retry
    from tests.test_passwords import locked_pdf

    ctx = make_ctx()
    r = ingest_bytes(ctx, locked_pdf("sesame"), dataset="default", filename="ledger.pdf")
    assert run_job(r.job_id, ctx=ctx).result == "failed"
    opening, unlocked = threading.Event(), threading.Event()
    worker: list[Background] = []

    def hold_the_worker_at_the_open(**_) -> None:
        opening.set()
        assert unlocked.wait(30)

    def another_operator_retries(**_) -> None:
        with Session(ctx.engine) as session:
            assert jobs.retry(session=session, job_ids=[r.job_id], actor="other")[0].ok
        worker.append(Background(lambda: run_job(r.job_id, ctx=ctx)))
        worker[0].start()
        assert opening.wait(30)

    with (
        faults.hook("before_open", hold_the_worker_at_the_open),
        faults.hook("unlock_decrypted", another_operator_retries),
    ):
        result = unlock_and_retry(ctx, r.job_id, "sesame", actor="op")
        unlocked.set()
        worker[0].result(timeout=60)
    assert result.ok, result.message
    run_until_quiet(ctx, rounds=2)
    j = get(ctx.engine, r.job_id)
    assert j.status == JobStatus.succeeded, (j.error_code, j.error_message)
    assert j.attempt == 1  # the attempt the replaced file ended was not the job's failure


# --- 8. webhooks arrive in the order the transitions happened -------------------------------------


def test_8_a_retried_jobs_success_waits_for_its_older_failure_to_be_delivered(
    database_url, monkeypatch
):
    from sluice.pipeline.queueing import webhook_delivery
    from sluice.settings import reset_settings_cache
    from sluice.storage.db import get_engine

    monkeypatch.setenv("SLUICE_WEBHOOK_URLS", "http://127.0.0.1:9/hook")
    monkeypatch.setenv("SLUICE_WEBHOOK_SECRET", "s" * 32)
    reset_settings_cache()
    engine = get_engine(database_url)
    received, down = [], [True]

    def receiver(request: httpx.Request) -> httpx.Response:
        if down[0]:
            return httpx.Response(503)
        received.append(request.headers["X-Sluice-Event"])
        return httpx.Response(200)

    def deliver():
        return webhook_delivery.deliver_due(
            engine=engine,
            secret="s" * 32,
            timeout=2,
            max_age_seconds=3600,
            base=100,
            cap=100,
            transport=httpx.MockTransport(receiver),
        )

    job_id = new_job(engine, 1)
    fail(engine, job_id, claim(engine, job_id).job.lease, ErrorKind.permanent)
    assert deliver().failed  # the receiver is down: job.failed backs off
    down[0] = False
    with Session(engine) as session:
        assert jobs.retry(session=session, job_ids=[job_id], actor="op")[0].ok
    succeed_now(engine, job_id, claim(engine, job_id).job.lease)
    deliver()  # the success is due now; the failure is not
    with Session(engine) as session:  # time passes: the failure is due again
        session.execute(update(WebhookDelivery).values(next_attempt_at=WebhookDelivery.created_at))
        session.commit()
    deliver()
    deliver()
    assert received == ["job.failed", "job.succeeded"]
    reset_settings_cache()


# --- 9. the reaper's cancel removes what the attempt wrote ----------------------------------------


class Died(BaseException):
    """The worker's process ends here (nothing in the runner handles it)."""


def test_9_a_cancel_carried_out_by_the_reaper_removes_the_attempts_chunks(database_url, make_ctx):
    from sluice.pipeline.queueing import recovery

    ctx = make_ctx(SLUICE_EMBED_BATCH_SIZE="4")
    recovery.run_once(ctx, publish=lambda _id: None)
    r = ingest_bytes(ctx, TEXT, dataset="default", filename="survey.txt")

    def die(**_) -> None:
        raise Died()

    with faults.hook("after_index", die), pytest.raises(Died):
        run_job(r.job_id, ctx=ctx)
    assert ids_of_job(ctx, r.job_id) and lexical.count_job(ctx.engine, r.job_id)
    with Session(ctx.engine) as session:
        [res] = jobs.request_cancel(session=session, job_ids=[r.job_id], actor="op")
        assert res.ok and "vectors are removed" in res.message
        job = session.get(Job, r.job_id)
        job.heartbeat_at -= timedelta(seconds=ctx.settings.lease_seconds * 2)
        session.add(job)
        session.commit()
    assert recovery.run_once(ctx, publish=lambda _id: None).reaped == [r.job_id]
    assert get(ctx.engine, r.job_id).status == JobStatus.cancelled
    assert ids_of_job(ctx, r.job_id) == []
    assert lexical.count_job(ctx.engine, r.job_id) == 0


__all__ = ["LEASE", "Dataset"]


# --- suspected in issue 25: each confirmed with a forced test and fixed, or shown impossible ------


def test_c_a_pause_refusal_that_loses_to_a_priority_change_keeps_the_job_published(
    database_url, monkeypatch
):
    """The worker took the job's message while its dataset is paused; an operator's "run next"
    lands between the worker's read and its refusal's compare-and-set."""
    from sluice.storage import pauses
    from sluice.storage.db import get_engine
    from sluice.storage.outbox import dispatch, unsent_count

    engine = get_engine(database_url)
    job_id = new_job(engine, 1)
    assert dispatch(engine=engine, publish=lambda _id: None).sent == [job_id]  # on the queue
    with Session(engine) as session:
        pauses.pause(session=session, dataset_id=get(engine, job_id).dataset_id, actor="op")
    looked = pauses.pause_for

    def and_run_next_lands(**kw):
        held = looked(**kw)
        with Session(engine) as session:
            assert jobs.run_next(session=session, job_ids=[job_id], actor="op")[0].ok
        return held

    monkeypatch.setattr(pauses, "pause_for", and_run_next_lands)
    assert not claim(engine, job_id).claimed
    monkeypatch.setattr(pauses, "pause_for", looked)
    with Session(engine) as session:
        assert unsent_count(session=session) == 1  # published again once the pause is lifted


def test_c_a_deleted_running_job_writes_nothing_after_the_delete(database_url, make_ctx):
    """The document is deleted while its job runs, after its last batch and before the check that
    writes back what is missing from the index, and before its lexical rows."""
    from sluice.ops.documents import delete_document

    # No heartbeat lands in the window (one would notice the lost lease by luck of timing).
    ctx = make_ctx(
        SLUICE_EMBED_BATCH_SIZE="4", SLUICE_HEARTBEAT_SECONDS="60", SLUICE_LEASE_SECONDS="600"
    )
    r = ingest_bytes(ctx, TEXT, dataset="default", filename="survey.txt")

    def deleted_now(**_) -> None:
        assert delete_document(ctx, r.job_id, actor="op").ok

    with faults.hook("before_verify", deleted_now):
        outcome = run_job(r.job_id, ctx=ctx)
    assert outcome.result == "lost"
    assert ids_of_job(ctx, r.job_id) == [] and lexical.count_job(ctx.engine, r.job_id) == 0


def test_c_an_error_while_a_batch_is_written_cancels_the_encode_ahead(
    database_url, make_ctx, monkeypatch
):
    from sluice.errors import TransientError
    from sluice.pipeline.running import embed

    ctx = make_ctx(SLUICE_EMBED_BATCH_SIZE="4")
    started = []
    submit = embed.submit

    class Tracked:
        def __init__(self, inner) -> None:
            self.inner, self.cancelled = inner, False
            started.append(self)

        def result(self):
            return self.inner.result()

        def cancel(self) -> None:
            self.cancelled = True
            self.inner.cancel()

    monkeypatch.setattr(embed, "submit", lambda embedder, texts: Tracked(submit(embedder, texts)))
    r = ingest_bytes(ctx, TEXT, dataset="default", filename="survey.txt")

    def the_store_fails(**_) -> None:
        raise TransientError("injected_fault", "the first write failed", "")

    with faults.hook("embed_batch", the_store_fails):
        assert run_job(r.job_id, ctx=ctx).result == "retrying"
    assert len(started) == 2  # the first batch was being written, the second encoding
    assert started[1].cancelled


def test_c_two_operators_applying_settings_to_one_dataset_at_once_lose_nothing(
    database_url, make_ctx
):
    ctx = make_ctx()
    ingest_bytes(ctx, TEXT, dataset="default", filename="survey.txt")
    other = []

    def the_other_operator_applies_first(**_) -> None:
        if not other:
            other.append(None)
            other[0] = settings_changes.apply(ctx, "default", {"chunk_overlap": "20"}, actor="b")

    with faults.hook("settings_proposed", the_other_operator_applies_first):
        mine = settings_changes.apply(ctx, "default", {"chunk_size": "300"}, actor="a")
    assert other[0].ok and other[0].applied
    view = settings_changes.current(ctx, "default")
    if mine.applied:  # both changes are in force, and the version is the one they make
        assert view.overrides == {"chunk_size": 300, "chunk_overlap": 20}, view.overrides
    else:  # the second is refused and says why; the first stands
        assert not mine.ok and "changed meanwhile" in mine.message
        assert view.overrides == {"chunk_overlap": 20}
    with Session(ctx.engine) as session:
        ds = session.exec(select(Dataset).where(Dataset.name == "default")).one()
        waiting = session.exec(select(Job).where(Job.status.in_(jobs.CLAIMABLE))).all()
    assert {j.pipeline_version for j in waiting} == {ctx.version_for(ds)}


def test_c_a_short_database_drop_during_a_progress_write_costs_no_attempt(
    database_url, make_ctx, monkeypatch
):
    from sqlalchemy.exc import OperationalError

    ctx = make_ctx(SLUICE_EMBED_BATCH_SIZE="4")
    r = ingest_bytes(ctx, TEXT, dataset="default", filename="survey.txt")
    write = jobs.progress
    dropped = []

    def drops_once(**kw):
        if not dropped:
            dropped.append(1)
            raise OperationalError("UPDATE job", {}, Exception("server closed the connection"))
        return write(**kw)

    monkeypatch.setattr(jobs, "progress", drops_once)
    outcome = run_job(r.job_id, ctx=ctx)
    assert dropped and outcome.result == "succeeded", outcome
    assert get(ctx.engine, r.job_id).attempt == 1


def test_c_prune_keeps_the_fresh_events_of_a_job_reindexed_while_it_runs(database_url, make_ctx):
    ctx = make_ctx()
    job_id = new_job(ctx.engine, 1)
    succeed_now(ctx.engine, job_id, claim(ctx.engine, job_id).job.lease)

    def reindexed_now(**_) -> None:
        with Session(ctx.engine) as session:
            assert jobs.reindex(session=session, job_ids=[job_id], actor="op")[0].ok

    with faults.hook("prune_history_selected", reindexed_now):
        prune(ctx.engine, days=30, future=31)  # the job finished "more than 30 days ago"
    kinds = [e.kind for e in events(ctx, job_id)]
    assert "reindex_requested" in kinds, kinds


def test_c_a_datasets_chunk_count_during_a_reindex_is_what_search_serves(database_url, make_ctx):
    from sluice.storage import queries

    ctx = make_ctx()
    r = ingest_bytes(ctx, TEXT, dataset="default", filename="survey.txt")
    assert run_job(r.job_id, ctx=ctx).result == "succeeded"
    served_now = get(ctx.engine, r.job_id).chunk_count
    with Session(ctx.engine) as session:
        assert jobs.reindex(session=session, job_ids=[r.job_id], actor="op")[0].ok
        [row] = [d for d in queries.dataset_summaries(session=session) if d["name"] == "default"]
    assert row["chunks"] == served_now, row


def test_c_the_drain_time_while_the_queue_is_paused_says_so(database_url, make_ctx):
    from sluice.ops import reads
    from sluice.storage import pauses

    ctx = make_ctx()
    first = ingest_bytes(ctx, TEXT, dataset="default", filename="survey.txt")
    assert run_job(first.job_id, ctx=ctx).result == "succeeded"  # a rate to estimate from
    ingest_bytes(ctx, TEXT + b"more", dataset="default", filename="more.txt")
    with Session(ctx.engine) as session:
        pauses.pause(session=session, dataset_id=None, actor="op")
    drain = reads.overview(None).drain
    assert drain.eta is None and "paused" in drain.describe(), drain.describe()
