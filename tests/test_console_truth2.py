"""What the console and the CLI say is true, continued (issue 27, items 5, 7, 12-14 and the pages
the operator looked for): per-dataset versions, a job's counts as they are, labels, estimates
from measured rates only, and the hit-testing page."""

from __future__ import annotations

import shutil

import pytest
from sqlmodel import Session, select

from sluice import faults
from tests.support.apptest import open_console, texts
from tests.support.helpers import job, run_file


def _own_chunking(ctx, name: str, size: int = 400) -> str:
    """Give dataset ``name`` chunking of its own; its pipeline version."""
    from sluice.storage.models import Dataset

    with Session(ctx.engine) as session:
        ds = session.exec(select(Dataset).where(Dataset.name == name)).one()
        ds.parse_settings = {"chunk_size": size, "chunk_overlap": 40}
        session.add(ds)
        session.commit()
        session.refresh(ds)
        return ctx.version_for(ds)


def _fact(at, label: str) -> str:
    """A fact of the Jobs page's detail row ("**Pages**  \\nvalue"), as the person reads it."""
    for md in at.markdown:
        if str(md.value).startswith(f"**{label}**"):
            return str(md.value).split("\n", 1)[1].replace("\\", "")
    raise AssertionError(f"no fact {label!r} on the page")


# --- item 5: every dataset judged against its own pipeline version --------------------------------


def test_reindex_dry_run_judges_each_dataset_by_its_own_pipeline_version(ctx, capsys):
    from sluice.cli.main import main
    from sluice.pipeline.running.runner import run_job
    from sluice.storage.models import Job, JobStatus

    run_file(ctx, b"Charts of the northern sound. " * 40, "charts.txt", "default")
    run_file(ctx, b"Rigging of tall ships. " * 30, "ships.txt", "rag-demo")
    own = _own_chunking(ctx, "rag-demo")
    assert main(["reindex", "--all", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"1 document(s) to rebuild with pipeline {own}" in out and "(1 chunk today)" in out
    assert main(["reindex", "--all"]) == 0
    capsys.readouterr()
    with Session(ctx.engine) as session:
        waiting = session.exec(select(Job.id).where(Job.status == JobStatus.pending)).all()
    assert len(waiting) == 1 and run_job(waiting[0], ctx=ctx).result == "succeeded"
    assert main(["reindex", "--all", "--dry-run"]) == 0
    out = capsys.readouterr().out
    # It said "every document is on pipeline <the global version>": rag-demo's is another.
    assert "every document is on its dataset's pipeline version: nothing to reindex" in out, out
    assert f"default {ctx.pipeline_version}" in out and f"rag-demo {own}" in out
    assert main(["reindex", "--all", "--dry-run", "--dataset", "rag-demo"]) == 0
    assert f"every document is on pipeline {own}" in capsys.readouterr().out


def test_integrity_over_all_datasets_names_each_datasets_own_version(ctx):
    from sqlalchemy import update

    from sluice.storage.models import Job

    run_file(ctx, b"Charts of the northern sound. " * 40, "charts.txt", "default")
    ships = run_file(ctx, b"Rigging of tall ships. " * 30, "ships.txt", "rag-demo")
    own = _own_chunking(ctx, "rag-demo")
    with Session(ctx.engine) as session:  # as if built under its own settings
        session.execute(update(Job).where(Job.id == ships.id).values(pipeline_version=own))
        session.commit()
    at = open_console("integrity")
    at.toggle(key="reindex_preview").set_value(True).run()
    page = texts(at)
    assert (
        "Every document is on its dataset's pipeline version "
        f"(default {ctx.pipeline_version}, rag-demo {own})"
    ) in page, page
    assert "pipeline of each dataset" not in page


# --- item 7: a job's pages and chunks as they are -------------------------------------------------


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


# --- /metrics: every service's sluice_up, and job series from the first scrape --------------------


def test_metrics_say_whether_chroma_and_the_cache_answer_and_every_job_status_from_zero(ctx):
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from sluice.ops.metrics import SluiceCollector

    run_file(ctx, b"Charts of the northern sound. " * 40, "charts.txt", "default")
    registry = CollectorRegistry()
    registry.register(SluiceCollector())
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(generate_latest(registry).decode())
        for s in family.samples
    }
    up = {dict(k)["service"]: v for (name, k), v in samples.items() if name == "sluice_up"}
    assert up == {"database": 1, "queue": 1, "cache": 1, "chroma": 1}
    jobs = {
        dict(k)["status"]: v
        for (name, k), v in samples.items()
        if name == "sluice_jobs" and dict(k)["dataset"] == "default"
    }
    assert jobs["succeeded"] == 1
    assert {s: jobs.get(s) for s in ("failed", "cancelled", "pending", "deleted")} == {
        "failed": 0,
        "cancelled": 0,
        "pending": 0,
        "deleted": 0,
    }


# --- the re-chunk preview's time, from the measured rate only -------------------------------------


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


# --- the Hit testing page -------------------------------------------------------------------------


def test_hit_testing_shows_each_rankers_view_and_runs_a_past_query_again(ctx):
    from sluice.ops import reads

    run_file(ctx, b"The lighthouse keeper lit the lamp at dusk. " * 30, "keeper.txt")
    run_file(ctx, b"Orchards of the valley bloom in spring. " * 30, "orchard.txt")
    run_file(ctx, b"A harbour wall shelters the fishing boats. " * 30, "harbour.txt")

    at = open_console("hit_testing")
    at.text_area(key="hit_query").set_value("lighthouse keeper")
    at.button(key="FormSubmitter:hit_test_form-Test").click().run()
    assert not at.exception
    table = at.dataframe[0].value
    for column in ("rank", "score", "dense rank", "similarity", "distance", "lexical rank"):
        assert column in table.columns
    first = table.iloc[0]
    assert first["file"] == "keeper.txt" and first["found by"] == "dense and lexical"
    assert first["dense rank"] == 1 and first["lexical rank"] == 1 and first["lexical score"] > 0
    assert abs(first["distance"] - (1 - first["similarity"])) < 1e-3
    # The ranking is the Search page's own: the same chunks in the same order.
    same = reads.search("lighthouse keeper", "default", 10, mode="hybrid")
    assert list(table["score"]) == [h.score for h in same]
    assert table["dense rank"].notna().all()  # every hybrid hit here was also found by meaning

    at.text_area(key="hit_query").set_value("orchards in spring")
    at.selectbox(key="hit_mode").set_value("lexical")
    at.button(key="FormSubmitter:hit_test_form-Test").click().run()
    table = at.dataframe[0].value
    assert table.iloc[0]["file"] == "orchard.txt" and table["dense rank"].isna().all()

    at = open_console("hit_testing")  # a new session: the history is in the job database
    page = texts(at)
    assert page.index("orchards in spring") < page.index("lighthouse keeper")  # newest first
    again = [b for b in at.button if b.key and b.key.startswith("hit_again_")]
    assert len(again) == 2
    again[-1].click().run()  # the oldest: lighthouse keeper, hybrid
    assert at.text_area(key="hit_query").value == "lighthouse keeper"
    assert at.dataframe[0].value.iloc[0]["file"] == "keeper.txt"
    assert "hits in default (hybrid)" in texts(at)


def test_the_hit_test_history_keeps_the_last_20_of_each_operator(ctx):
    from sluice.storage import hit_tests

    with Session(ctx.engine) as session:
        for i in range(25):
            hit_tests.record(
                session=session,
                operator="ana",
                dataset="d",
                query=f"q{i}",
                mode="hybrid",
                k=5,
                hits=i,
            )
        hit_tests.record(
            session=session, operator="ben", dataset="d", query="b", mode="dense", k=5, hits=0
        )
        kept = hit_tests.recent(session=session, operator="ana")
        assert [r.query for r in kept] == [f"q{i}" for i in range(24, 4, -1)]
        assert [r.query for r in hit_tests.recent(session=session, operator="ben")] == ["b"]


# --- item 14: the New-dataset popover, and what the pages say ------------------------------------


def test_the_new_dataset_popover_closes_after_create(ctx):
    from sluice.ops import reads

    at = open_console()
    at.session_state["new_dataset_popover"] = True  # the operator opened it
    at.run()
    at.text_input(key="new_dataset_name").set_value("contracts-2024")
    at.button(key="create_dataset").click().run()
    assert not at.exception
    assert "contracts-2024" in [d.name for d in reads.datasets()]
    assert at.session_state["new_dataset_popover"] is False  # closed (it stayed open)


def test_a_job_of_one_chunk_from_one_page_says_so_in_words(ctx):
    small = run_file(ctx, b"A short note on the tide tables.", "note.txt")
    assert (small.chunk_count, small.page_count) == (1, 1)
    page = texts(open_console("jobs", query={"job": str(small.id)}))
    assert "Indexed: 1 chunk from 1 page (1 embedded, 0 from cache)" in page, page
    assert "1 chunks" not in page and "1 pages" not in page


# --- item 13: the Document view says where a chunk is as search does ------------------------------


def test_the_document_view_labels_office_chunks_by_section_as_search_does(ctx):
    from tests.test_formats import make_docx

    done = run_file(ctx, make_docx(), "report.docx")
    at = open_console("document", query={"doc": f"doc:{done.document_id}"})
    options = at.radio(key="document_chunk").options
    assert any("section 2: Tariffs" in o for o in options), options
    assert not any("page 1" in o or "page 2" in o for o in options)
    assert "section 2: Tariffs" in texts(at)


@pytest.mark.skipif(shutil.which("tesseract") is None, reason="needs Debian's tesseract-ocr")
def test_an_ocr_page_is_not_said_to_lack_the_chunks_words_as_if_in_error(ctx):
    from tests.support import pdfmaker

    done = run_file(ctx, pdfmaker.scanned(), "scan.pdf")
    at = open_console("document", query={"doc": f"doc:{done.document_id}"})
    assert "chunk 0 · page 1 · text read by OCR" in texts(at)
    [caption] = [img.caption for e in at.get("image") for img in e.proto.imgs]
    # It said "the chunk's words were not found on it as written", which reads as an error.
    assert caption == (
        "page 1, the chunk was recognised by OCR; the page image has no text layer to compare with"
    )
