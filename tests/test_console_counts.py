"""The counts the console shows are the ones that happened (issue 27, items 7, 12 and 14): a job's
pages while it embeds, the chunks a cancel removed, a locked PDF's pages, one chunk said in words,
the drain time without what a paused dataset holds, and the re-chunk preview's time from the
measured rate only."""

from __future__ import annotations

from sqlmodel import Session, select

from sluice import faults
from tests.support.apptest import open_console, texts
from tests.support.helpers import job, run_file


def _fact(at, label: str) -> str:
    """A fact of the Jobs page's detail row ("**Pages**  \\nvalue"), as the person reads it."""
    for md in at.markdown:
        if str(md.value).startswith(f"**{label}**"):
            return str(md.value).split("\n", 1)[1].replace("\\", "")
    raise AssertionError(f"no fact {label!r} on the page")


def test_a_job_of_one_chunk_says_1_chunk():
    from sluice.console import ui

    row = {"status": "succeeded", "cancel_requested": False, "chunk_count": 1, "attempt": 1}
    row |= {"max_attempts": 3, "error_message": "", "error_kind": None, "stage": "done"}
    assert ui.job_cells(row)["progress"] == "1 chunk"
    assert ui.count(2400, "chunk") == "2,400 chunks"


def test_a_job_of_one_chunk_from_one_page_says_so_in_words(ctx):
    small = run_file(ctx, b"A short note on the tide tables.", "note.txt")
    assert (small.chunk_count, small.page_count) == (1, 1)
    page = texts(open_console("jobs", query={"job": str(small.id)}))
    assert "Indexed: 1 chunk from 1 page (1 embedded, 0 from cache)" in page, page
    assert "1 chunks" not in page and "1 pages" not in page


# --- a job's pages and chunks as they are (item 7) ------------------------------------------------


def test_a_job_tells_its_page_count_while_it_embeds(ctx, samples):
    from sluice.ops.ingest import ingest_bytes
    from sluice.pipeline.running.runner import run_job

    data = (samples / "004-pdflatex-4-pages.pdf").read_bytes()
    r = ingest_bytes(ctx, data, dataset="default", filename="four.pdf")
    seen: list[tuple[int | None, str]] = []

    def look(**_) -> None:
        if not seen:
            at = open_console("jobs", query={"job": str(r.job_id)})
            seen.append((job(ctx, r.job_id).page_count, _fact(at, "Pages")))

    with faults.hook("embed_batch", look):
        assert run_job(r.job_id, ctx=ctx).result == "succeeded"
    assert seen == [(4, "4")], seen  # it said "Pages —" until the job ended


def test_a_cancelled_job_does_not_show_the_chunks_it_removed(ctx):
    from sluice.ops.ingest import ingest_bytes
    from sluice.pipeline.running.runner import run_job
    from sluice.storage import jobs

    r = ingest_bytes(ctx, b"Soundings off the reef. " * 400, dataset="default", filename="r.txt")

    def cancel(**_) -> None:
        with Session(ctx.engine) as session:
            assert jobs.request_cancel(session=session, job_ids=[r.job_id], actor="op")[0].ok

    with faults.hook("after_index", cancel):
        assert run_job(r.job_id, ctx=ctx).result == "cancelled"
    assert job(ctx, r.job_id).total > 1  # the chunks it had written, all removed
    at = open_console("jobs", query={"job": str(r.job_id)})
    assert _fact(at, "Chunks") == "0 (removed on cancel)"


def test_a_locked_pdf_does_not_say_it_has_0_pages(ctx, samples):
    data = (samples / "005-libreoffice-writer-password.pdf").read_bytes()
    locked = run_file(ctx, data, "locked.pdf")
    assert locked.error_code == "password_protected"
    at = open_console("jobs", query={"job": str(locked.id)})
    pages = _fact(at, "Pages")
    assert pages != "0" and "locked" in pages, pages


# --- estimates: the drain time and the re-chunk preview's time ------------------------------------


def test_the_drain_time_leaves_out_what_a_paused_dataset_holds(ctx):
    """The only waiting job is in a paused dataset: over all datasets there is no drain time
    (it said "Queue drains in 2 ms"), and the reason is named."""
    from sluice.ops import pausing, reads
    from sluice.ops.access import Operator
    from sluice.ops.ingest import ingest_bytes
    from sluice.storage.models import Dataset

    run_file(ctx, b"Charts of the northern sound. " * 40, "charts.txt", "default")  # a rate
    ingest_bytes(ctx, b"Rigging of tall ships. " * 30, dataset="rag-demo", filename="ships.txt")
    with Session(ctx.engine) as session:
        held = session.exec(select(Dataset).where(Dataset.name == "rag-demo")).one().id
    assert pausing.pause(Operator("test", "operator"), dataset_id=held).ok
    estimate = reads.overview(None).drain
    assert estimate.eta is None and "paused dataset (rag-demo)" in estimate.describe()
    page = texts(open_console("overview"))
    assert "paused dataset (rag-demo)" in page and "ms" not in page.split("Queue drains in")[1][:12]


def test_the_rechunk_preview_says_how_long_at_the_measured_rate_or_that_none_was_measured(ctx):
    from datetime import timedelta

    from sqlalchemy import update

    from sluice.ops import reads
    from sluice.storage.models import Job, JobEvent, utcnow

    def preview() -> str:
        at = open_console("datasets", query={"dataset": "alpha"})
        at.number_input(key="settings_form:alpha:chunk_size").set_value(400)
        at.button(key="FormSubmitter:settings_form:alpha-Preview the change").click().run()
        return texts(at)

    done = run_file(ctx, b"The harbour master logs each arrival. " * 80, "harbour.txt", "alpha")
    rate = reads.chunk_rate()
    assert rate and rate > 0
    page = preview()
    assert "1 document(s) to rebuild" in page
    assert "at the last hour's rate (" in page and "chunks/s while busy)" in page, page

    long_ago = utcnow() - timedelta(hours=3)  # the only job finished before the last hour
    with Session(ctx.engine) as session:
        session.execute(update(Job).where(Job.id == done.id).values(finished_at=long_ago))
        session.execute(update(JobEvent).where(JobEvent.job_id == done.id).values(at=long_ago))
        session.commit()
    assert reads.chunk_rate() is None
    page = preview()
    assert "Time to rebuild: no recent rate measured" in page and "min at" not in page
