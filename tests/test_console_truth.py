"""What the console and the CLI say is true (issue 27, items 5-14): the formats named, the datasets
searched, counts and labels that match what happened."""

from __future__ import annotations

import pytest
from sqlmodel import Session, select

from tests.support.apptest import open_console, texts
from tests.support.helpers import run_file
from tests.support.seed import seed_every_state


@pytest.fixture
def seeded(ctx):
    return seed_every_state(ctx)


def test_first_visit_and_the_search_filter_name_every_format_sluice_indexes(ctx):
    page = texts(open_console())
    for name in ("PDF", "Word (.docx)", "PowerPoint (.pptx)", "EPUB", "HTML", "CSV"):
        assert name in page
    at = open_console("search")
    box = at.selectbox(key="search_media_type")  # AppTest lists the labels the page shows
    assert {"PDF", "Word (.docx)", "PowerPoint (.pptx)", "EPUB", "HTML", "CSV"} <= set(box.options)
    box.set_value("text/html")
    at.run()
    assert not at.exception


def test_dead_letters_link_every_row_to_its_job_and_a_locked_file_to_its_password_form(ctx, seeded):
    locked = seeded["failed:password_protected"]
    at = open_console("dead_letters")
    page = texts(at)
    # The password group says one thing to do, not also "upload a corrected file".
    assert "give each file's password on its job" in page
    links = {(p.proto.label, p.proto.page) for p in at.get("page_link")}
    for job_id in locked:
        assert any(f"(job {job_id})" in label and "password" in label for label, _ in links)
    table = next(df.value for df in at.dataframe if "open" in df.value.columns)
    assert all(url == f"jobs?job={j}" for url, j in zip(table["open"], table["job"], strict=True))


def test_cli_search_spans_every_dataset_as_the_console_does_and_says_which(ctx, capsys):
    from sluice.cli.main import main

    run_file(ctx, b"The lighthouse keeper lit the lamp at dusk. " * 30, "keeper.txt", "default")
    run_file(ctx, b"A lighthouse stands on the northern cape. " * 30, "cape.txt", "coast")
    assert main(["search", "lighthouse"]) == 0
    out = capsys.readouterr().out
    assert "searched 2 dataset(s): coast, default" in out
    assert "keeper.txt" in out and "cape.txt" in out
    assert main(["search", "lighthouse", "--dataset", "coast"]) == 0
    out = capsys.readouterr().out
    assert "searched 1 dataset(s): coast" in out and "keeper.txt" not in out


def test_the_retry_anyway_prompt_is_one_sentence_with_one_full_stop(ctx, seeded):
    job_id = seeded["failed:password_protected"][0]
    at = open_console("jobs", query={"job": str(job_id)})
    at.button(key=f"retry_{job_id}").click().run()
    prompt = next(t for t in texts(at).split("\n") if "Retry anyway?" in t)
    assert ".." not in prompt and ". . " not in prompt, prompt


def test_pause_and_resume_say_it_once_unescaped_and_a_pause_is_not_paused_paused(ctx):
    from sluice.ops.ingest import ingest_bytes

    ingest_bytes(ctx, b"Rigging of tall ships. " * 30, dataset="rag-demo", filename="ships.txt")
    at = open_console("overview", query={"dataset": "rag-demo"})
    at.button(key="pause_scope").click().run()
    at.button(key="pause_scope:yes").click().run()
    page = texts(at)
    assert "\\" not in page, page  # escaped once: the person reads no backslash
    assert "Paused: paused" not in page and "Paused (dataset rag-demo" in page
    resume = next(b for b in at.button if b.key and b.key.startswith("resume_"))
    resume.click().run()
    assert "\\" not in texts(at)


def test_a_job_of_one_chunk_says_1_chunk():
    from sluice.console import ui

    row = {"status": "succeeded", "cancel_requested": False, "chunk_count": 1, "attempt": 1}
    row |= {"max_attempts": 3, "error_message": "", "error_kind": None, "stage": "done"}
    assert ui.job_cells(row)["progress"] == "1 chunk"
    assert ui.count(2400, "chunk") == "2,400 chunks"


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


def test_the_system_page_tells_the_chroma_servers_api_version_from_the_package(ctx):
    from importlib import metadata

    from sluice.ops import health

    [chroma] = [p for p in health.probes(ctx.settings) if p.name == "chroma"]
    assert chroma.reachable and "server chroma" not in chroma.detail
    assert f"the chromadb package here is {metadata.version('chromadb')}" in chroma.detail
    assert "API version" in chroma.detail


def test_integrity_never_shows_another_datasets_check_as_this_ones(ctx):
    from sluice.pipeline.reconcile.audit import reconcile

    run_file(ctx, b"Charts of the northern sound. " * 40, "charts.txt", "default")
    run_file(ctx, b"Rigging of tall ships. " * 30, "ships.txt", "rag-demo")
    reconcile(ctx, dataset="rag-demo")
    page = texts(open_console("integrity", query={"dataset": "default"}))
    assert "dataset rag-demo" not in page and "No reconcile of dataset default" in page
    page = texts(open_console("integrity", query={"dataset": "rag-demo"}))
    assert "Last check of dataset rag-demo" in page


def test_integrity_of_a_dataset_with_its_own_chunking_names_its_own_pipeline(ctx):
    from sluice.storage.models import Dataset

    run_file(ctx, b"Rigging of tall ships. " * 30, "ships.txt", "rag-demo")
    with Session(ctx.engine) as session:
        ds = session.exec(select(Dataset).where(Dataset.name == "rag-demo")).one()
        ds.parse_settings = {"chunk_size": 400, "chunk_overlap": 40}
        session.add(ds)
        session.commit()
        session.refresh(ds)
        own = ctx.version_for(ds)
    assert own != ctx.pipeline_version
    page = texts(open_console("integrity", query={"dataset": "rag-demo"}))
    assert f"pipeline **{own}** (chunks of 400 characters, overlap 40" in page
    assert ctx.pipeline_version not in page
