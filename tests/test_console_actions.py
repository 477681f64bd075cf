"""Console actions change the job database as the state machine says, and put work on the queue."""

from __future__ import annotations

import pytest
from sqlmodel import Session

from sluice.storage.models import Job, JobStatus
from tests.support.apptest import assert_ok, open_console, select_rows, texts
from tests.support.helpers import events
from tests.support.seed import seed_every_state


@pytest.fixture
def seeded(ctx):
    """Jobs in every state in the default dataset: {label: [job ids]} (see
    tests/support/seed.py)."""
    return seed_every_state(ctx)


def _job(ctx, job_id: int) -> Job:
    with Session(ctx.engine) as session:
        return session.get(Job, job_id)


def test_retry_from_job_detail_queues_the_job_again(ctx, seeded):
    from sluice.pipeline.queueing.broker import queued_job_ids

    job_id = seeded["failed:chroma_unreachable"][0]  # transient: a retry is the helpful action
    at = open_console("jobs", query={"job": str(job_id)})
    at.button(key=f"retry_{job_id}").click().run()
    assert_ok(at)
    job = _job(ctx, job_id)
    assert job.status == JobStatus.pending and job.attempt == 0 and job.error_message is None
    assert events(ctx, job_id)[-1].kind == "retried"
    assert events(ctx, job_id)[-1].actor == "console:local"
    assert job_id in queued_job_ids()  # dispatched right away
    assert "Retry: 1 job(s)" in texts(at)
    assert at.button(key=f"cancel_{job_id}")  # now pending: it can be cancelled instead


def test_cancel_asks_first_then_cancels_pending_and_flags_running(ctx, seeded):
    pending, running = seeded["pending"][0], seeded["running"][0]
    at = open_console("jobs", query={"job": str(pending)})
    at.button(key=f"cancel_{pending}").click().run()
    assert _job(ctx, pending).status == JobStatus.pending  # only the confirmation is showing
    assert "Stop this job?" in texts(at)
    at.button(key=f"cancel_{pending}:no").click().run()
    assert _job(ctx, pending).status == JobStatus.pending
    at.button(key=f"cancel_{pending}").click().run()
    at.button(key=f"cancel_{pending}:yes").click().run()
    assert_ok(at)
    assert _job(ctx, pending).status == JobStatus.cancelled

    at.query_params["job"] = str(running)
    at.run()
    at.button(key=f"cancel_{running}").click().run()
    at.button(key=f"cancel_{running}:yes").click().run()
    assert_ok(at)
    job = _job(ctx, running)
    assert job.status == JobStatus.running and job.cancel_requested
    assert "Cancel requested: the worker stops at its next batch" in texts(at)
    assert not [b for b in at.button if b.key == f"cancel_{running}"]  # asked once is enough


def test_reindex_asks_first_and_queues_a_rebuild(ctx, seeded):
    job_id = seeded["succeeded"][0]
    at = open_console("jobs", query={"job": str(job_id)})
    assert "Indexed:" in texts(at)
    at.button(key=f"reindex_{job_id}").click().run()
    assert _job(ctx, job_id).status == JobStatus.succeeded
    at.button(key=f"reindex_{job_id}:yes").click().run()
    assert_ok(at)
    assert _job(ctx, job_id).status == JobStatus.pending
    assert events(ctx, job_id)[-1].kind == "reindex_requested"


def test_dead_letters_grouped_with_counts_and_hints(seeded):
    at = open_console("dead_letters")
    page = texts(at)
    assert "5 failed job(s) in 4 group(s)" in page
    assert "needs your action · password protected" in page
    assert "Remove the password and upload the file again." in page
    assert "needs your action · no text layer" in page and "ocrmypdf" in page
    assert at.button(key="retry_all:user_action_required:password_protected").label == "Retry all 2"


def test_retry_all_of_a_group_shows_the_count_then_retries_them(ctx, seeded):
    ids = seeded["failed:password_protected"]
    at = open_console("dead_letters")
    at.button(key="retry_all:user_action_required:password_protected").click().run()
    assert "Retry all 2 job(s) of this group?" in texts(at)
    # The preview says what the retry costs before anything changes.
    assert "Cost: 2 job(s)" in texts(at) and "to embed" in texts(at)
    assert {_job(ctx, i).status for i in ids} == {JobStatus.failed}
    at.button(key="retry_all:user_action_required:password_protected:yes").click().run()
    assert_ok(at)
    assert {_job(ctx, i).status for i in ids} == {JobStatus.pending}
    assert "needs your action · password protected" not in texts(at)
    assert "3 failed job(s) in 3 group(s)" in texts(at)


def test_retry_selected_and_dismiss_selected(ctx, seeded):
    first, second = sorted(seeded["failed:password_protected"])
    group = "user_action_required:password_protected"
    at = open_console("dead_letters")
    table = next(df for df in at.dataframe if df.key == f"dl:{group}:0")
    rows = list(table.value["job"])
    select_rows(at, f"dl:{group}:0", [rows.index(second)])
    at.run()
    assert at.button(key=f"retry_sel:{group}").label == "Retry selected (1)"
    at.button(key=f"retry_sel:{group}").click().run()
    assert_ok(at)
    assert _job(ctx, second).status == JobStatus.pending
    assert _job(ctx, first).status == JobStatus.failed

    # the table got a new key: the old selection cannot point at another job now
    assert at.button(key=f"retry_sel:{group}").label == "Retry selected (0)"
    select_rows(at, f"dl:{group}:1", [0])
    at.run()
    at.button(key=f"dismiss_sel:{group}").click().run()
    assert_ok(at)
    job = _job(ctx, first)
    assert job.status == JobStatus.failed and job.dismissed
    assert "password_protected" not in texts(at)
    assert events(ctx, first)[-1].kind == "dismissed"


def test_a_retried_dead_letter_fails_again_through_a_real_worker(ctx, start_worker, samples):
    """The encrypted sample PDF: its retry runs for real and lands back in dead letters."""
    from sluice.ops.ingest import ingest_path
    from sluice.pipeline.queueing.publishing import publish
    from tests.support.helpers import wait_for

    start_worker()
    r = ingest_path(
        ctx, samples / "005-libreoffice-writer-password.pdf", dataset="default", publish=publish
    )
    [job] = wait_for(ctx, [r.job_id], timeout=60)
    assert job.status == JobStatus.failed and job.error_code == "password_protected"
    at = open_console("dead_letters")
    at.button(key="retry_all:user_action_required:password_protected").click().run()
    at.button(key="retry_all:user_action_required:password_protected:yes").click().run()
    assert_ok(at)
    [job] = wait_for(ctx, [r.job_id], timeout=60)
    kinds = [e.kind for e in events(ctx, r.job_id)]
    assert kinds.count("failed") == 2 and "retried" in kinds and kinds.count("claimed") == 2
    at.run()
    assert "needs your action · password protected" in texts(at)


def test_actions_work_while_the_queue_redis_is_down(ctx, seeded, services):
    job_id = seeded["failed:no_text_layer"][0]
    services.queue.stop()
    try:
        at = open_console("jobs", query={"job": str(job_id)})
        at.button(key=f"retry_{job_id}").click().run()  # "Retry anyway": it asks first
        at.button(key=f"retry_{job_id}:yes").click().run()
        assert_ok(at)
        assert _job(ctx, job_id).status == JobStatus.pending
        assert "queue unreachable" in texts(at)
    finally:
        services.queue.start()


def test_bulk_retry_by_filter_previews_then_acts_with_one_event_per_job(ctx, seeded, capsys):
    from sluice.cli import main

    ids = sorted(seeded["failed:password_protected"])
    assert (
        main(
            [
                "bulk",
                "retry",
                "--status",
                "failed",
                "--kind",
                "user_action_required",
                "--name",
                "password",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert (
        f"{len(ids)} job(s) match; {len(ids)} can be retried. Cost:" in out
        and "nothing changed" in out
    )
    assert {_job(ctx, i).status for i in ids} == {JobStatus.failed}

    assert (
        main(
            [
                "bulk",
                "retry",
                "--status",
                "failed",
                "--kind",
                "user_action_required",
                "--name",
                "password",
                "--yes",
            ]
        )
        == 0
    )
    capsys.readouterr()
    for i in ids:
        assert _job(ctx, i).status == JobStatus.pending
        retried = [e for e in events(ctx, i) if e.kind == "retried"]
        assert len(retried) == 1 and retried[0].message == "bulk retry by filter"
        assert retried[0].actor.startswith("cli:")


def test_bulk_reindex_from_the_jobs_page_acts_on_every_match_not_only_the_page(ctx, seeded):
    from tests.support.seed import seed_jobs

    seed_jobs(ctx.engine, 60, dataset="default", seed=3)
    at = open_console("jobs")
    at.selectbox(key="rows").set_value(25).run()
    at.multiselect(key="status").set_value(["succeeded"]).run()
    with Session(ctx.engine) as session:
        done = [j.id for j in session.query(Job).filter(Job.status == JobStatus.succeeded)]
    assert len(done) > 25  # more than one page
    at.session_state["bulk_action"] = "reindex"
    at.run()
    assert f"{len(done)} job(s) match; {len(done)} can be reindexed." in texts(at)
    at.button(key="bulk_reindex").click().run()
    assert {_job(ctx, i).status for i in done} == {JobStatus.succeeded}  # it asks first
    at.button(key="bulk_reindex:yes").click().run()
    assert_ok(at)
    assert {_job(ctx, i).status for i in done} == {JobStatus.pending}
    assert all(events(ctx, i)[-1].kind == "reindex_requested" for i in done)
    assert f"Reindex: {len(done)} job(s)" in texts(at)


def test_the_bulk_preview_counts_in_the_database_and_reads_ids_only_for_its_sample(
    ctx, monkeypatch
):
    """The Jobs page previews a bulk action on every refresh: it counts jobs and documents in SQL
    and reads job ids only for the sample the cost parses, never all of them."""
    from sluice.ops import preview, reads
    from sluice.storage.queries import JobFilter
    from tests.support.seed import seed_jobs

    seed_jobs(ctx.engine, 80, dataset="default", seed=5)
    with Session(ctx.engine) as session:
        done = [j.id for j in session.query(Job).filter(Job.status == JobStatus.succeeded)]
        docs = {j.document_id for j in session.query(Job).filter(Job.status == JobStatus.succeeded)}
    assert len(done) > 10
    monkeypatch.setattr(reads, "SAMPLE", 5)
    f = JobFilter(statuses=["succeeded"])

    plan = reads.bulk_preview("reindex", f, ids=False, with_cost=False)
    assert (plan.applicable, plan.documents, plan.job_ids) == (len(done), len(docs), [])
    parsed: list[int] = []
    real = preview.count_work
    monkeypatch.setattr(
        preview, "count_work", lambda *a, **k: parsed.append(k["document"].id) or real(*a, **k)
    )
    plan = reads.bulk_preview("reindex", f, ids=False, with_cost=True)
    assert plan.job_ids == sorted(done)[:5] and len(parsed) <= 5
    assert f"{len(done)} job(s)" in plan.cost  # the cost stands for all of them, extrapolated
    full = reads.bulk_preview("reindex", f, with_cost=False)
    assert full.job_ids == sorted(done) and full.applicable == len(done)
