"""Per-dataset parse settings: chunk size and overlap, OCR mode and language, set on one dataset.

A change shows its cost first, then reindexes that dataset and nothing else; search keeps serving
each document's old chunks until its new job succeeds; jobs of the old settings that had not run
build the new ones; workers read the settings with each job (no restart)."""

import json
import shutil

import pytest
from sqlmodel import Session, select

from sluice.cli.main import main
from sluice.ops import settings_changes
from sluice.ops.ingest import ingest_bytes
from sluice.ops.search import search
from sluice.pipeline.running.runner import run_job
from sluice.storage.models import Dataset, Document, Job, JobStatus
from tests.support import pdfmaker
from tests.support.helpers import events, ids_of_job, job
from tests.test_reconcile import indexed, text


def dataset_row(ctx, name):
    with Session(ctx.engine) as session:
        return session.exec(select(Dataset).where(Dataset.name == name)).one()


def active_jobs(ctx, name):
    with Session(ctx.engine) as session:
        ds = session.exec(select(Dataset).where(Dataset.name == name)).one()
        return {
            d.id: d.active_job_id
            for d in session.exec(select(Document).where(Document.dataset_id == ds.id))
        }


def test_a_change_shows_its_cost_then_reindexes_that_dataset_and_nothing_else(
    database_url, make_ctx
):
    ctx = make_ctx()
    a = indexed(ctx, ["harbour", "orchard", "glacier"], dataset="alpha")
    b = indexed(ctx, ["harbour", "meadow"], dataset="beta")
    before_b = active_jobs(ctx, "beta")

    # The preview costs the change under the new settings and writes nothing.
    change = settings_changes.propose(ctx, "alpha", {"chunk_size": "300", "chunk_overlap": "30"})
    assert change.ok and change.from_version == ctx.pipeline_version != change.to_version
    assert (change.plan.documents, change.plan.preview.sampled) == (3, 3)
    assert change.plan.preview.chunks > sum(
        j.chunk_count for j in a.values()
    )  # smaller chunks: more
    assert change.plan.preview.to_embed == change.plan.preview.chunks - change.plan.preview.cached
    assert dataset_row(ctx, "alpha").parse_settings is None
    assert len(ctx_jobs(ctx)) == 5

    done = settings_changes.apply(
        ctx, "alpha", {"chunk_size": "300", "chunk_overlap": "30"}, actor="test"
    )
    assert done.ok and done.applied and done.reindex.queued == 3, done.message
    row = dataset_row(ctx, "alpha")
    assert (
        row.parse_settings == {"chunk_size": 300, "chunk_overlap": 30}
        and row.settings_changed_by == "test"
    )

    new = {r.job_id for r in done.reindex.results}
    assert {job(ctx, i).pipeline_version for i in new} == {done.to_version}
    assert len(ctx_jobs(ctx)) == 8  # three new jobs, all in alpha
    # Search still serves the old chunks until the new jobs run.
    assert {h.job_id for h in search(ctx, query="glacier section", dataset="alpha", k=5)} <= {
        j.id for j in a.values()
    }

    for i in new:
        assert run_job(i, ctx=ctx).result == "succeeded"
        j = job(ctx, i)
        assert len(ids_of_job(ctx, i, "alpha")) == j.chunk_count > a[_topic(ctx, j)].chunk_count
        chunks = ctx.vectors.get(
            dataset_row(ctx, "alpha").collection, ids_of_job(ctx, i, "alpha"), include=["documents"]
        )["documents"]
        assert max(len(c) for c in chunks) <= 300
    assert set(active_jobs(ctx, "alpha").values()) == new
    assert active_jobs(ctx, "beta") == before_b and {j.pipeline_version for j in b.values()} == {
        ctx.pipeline_version
    }
    assert {h.job_id for h in search(ctx, query="glacier section", dataset="alpha", k=5)} <= new

    # New uploads to alpha are cut with its settings; beta keeps the process's.
    r = ingest_bytes(ctx, text("lantern"), dataset="alpha", filename="lantern.txt")
    assert job(ctx, r.job_id).pipeline_version == done.to_version
    r = ingest_bytes(ctx, text("lantern"), dataset="beta", filename="lantern.txt")
    assert job(ctx, r.job_id).pipeline_version == ctx.pipeline_version

    # Unsetting goes back to the process's settings (and the old version, whose jobs are superseded
    # now).
    back = settings_changes.apply(
        ctx, "alpha", {"chunk_size": None, "chunk_overlap": None}, actor="test"
    )
    assert back.ok and back.to_version == ctx.pipeline_version and back.reindex.queued == 3
    assert dataset_row(ctx, "alpha").parse_settings is None


def ctx_jobs(ctx):
    with Session(ctx.engine) as session:
        return session.exec(select(Job.id)).all()


def _topic(ctx, j):
    with Session(ctx.engine) as session:
        return session.get(Document, j.document_id).filename.removesuffix(".txt")


def test_a_job_waiting_under_the_old_settings_builds_the_new_ones(database_url, make_ctx):
    ctx = make_ctx()
    r = ingest_bytes(
        ctx, text("harbour"), dataset="alpha", filename="harbour.txt"
    )  # queued, not run yet
    old = job(ctx, r.job_id).pipeline_version

    done = settings_changes.apply(ctx, "alpha", {"chunk_size": "400"}, actor="test")
    assert done.ok and done.restamped == [r.job_id] and done.reindex.queued == 0
    j = job(ctx, r.job_id)
    assert j.pipeline_version == done.to_version != old and j.idempotency_key.endswith(
        done.to_version
    )
    assert [e.data for e in events(ctx, r.job_id) if e.kind == "restamped"] == [
        {"from_version": old, "to_version": done.to_version}
    ]

    # A worker started before the change reads the dataset's settings with the job: no restart.
    assert run_job(r.job_id, ctx=ctx).result == "succeeded"
    chunks = ctx.vectors.get(
        dataset_row(ctx, "alpha").collection,
        ids_of_job(ctx, r.job_id, "alpha"),
        include=["documents"],
    )["documents"]
    assert max(len(c) for c in chunks) <= 400 and len(chunks) == job(ctx, r.job_id).chunk_count


def test_bad_settings_are_refused_and_nothing_is_written(ctx):
    indexed(ctx, ["harbour"], dataset="alpha")
    cases = {
        ("colour", "blue"): "unknown dataset setting(s) colour",
        ("chunk_size", "50"): "chunk_size: Input should be greater than or equal to 100",
        ("chunk_overlap", "900"): "chunk_overlap (900) must be smaller than chunk_size (800)",
        ("ocr_mode", "sometimes"): "ocr_mode: Input should be 'auto', 'always' or 'off'",
        ("ocr_language", "eng; rm"): "ocr_language: String should match pattern",
    }
    for (key, value), words in cases.items():
        change = settings_changes.apply(ctx, "alpha", {key: value}, actor="test")
        assert not change.ok and words in change.message, change.message
    assert (
        settings_changes.apply(ctx, "nowhere", {"chunk_size": "400"}, actor="test").message
        == "no dataset named 'nowhere'"
    )
    assert dataset_row(ctx, "alpha").parse_settings is None
    assert len(ctx_jobs(ctx)) == 1


@pytest.mark.skipif(
    shutil.which("tesseract") is None, reason="needs Debian's tesseract-ocr: `make ocr`"
)
def test_ocr_off_in_one_dataset_leaves_its_scans_to_the_operator_and_the_other_reads_them(ctx):
    assert (
        settings_changes.apply(ctx, "typed-only", {"ocr_mode": "off"}, actor="test").ok is False
    )  # no such dataset yet
    ingest_bytes(ctx, text("harbour"), dataset="typed-only", filename="harbour.txt")
    assert settings_changes.apply(ctx, "typed-only", {"ocr_mode": "off"}, actor="test").ok

    off = ingest_bytes(ctx, pdfmaker.scanned(), dataset="typed-only", filename="scan.pdf")
    on = ingest_bytes(ctx, pdfmaker.scanned(), dataset="default", filename="scan.pdf")
    assert run_job(off.job_id, ctx=ctx).result == "failed"
    assert (job(ctx, off.job_id).error_code, job(ctx, off.job_id).error_kind.value) == (
        "no_text_layer",
        "user_action_required",
    )
    assert run_job(on.job_id, ctx=ctx).result == "succeeded"
    assert search(ctx, query="fog horn sounded twice a minute", dataset="default", k=1)[0].ocr

    # Turning OCR back on (auto) in that dataset and retrying reads the scan.
    back = settings_changes.apply(ctx, "typed-only", {"ocr_mode": None}, actor="test")
    assert back.ok and off.job_id in back.restamped
    from sluice.storage import jobs

    with Session(ctx.engine) as session:
        assert jobs.retry(session=session, job_ids=[off.job_id], actor="test")[0].ok
    assert run_job(off.job_id, ctx=ctx).result == "succeeded"


def test_the_cli_shows_previews_and_applies_with_yes(ctx, capsys):
    indexed(ctx, ["harbour", "orchard"], dataset="alpha")

    assert main(["datasets", "alpha"]) == 0
    out = capsys.readouterr().out
    assert (
        "chunk_size     800    default (SLUICE_*)" in out
        and f"pipeline {ctx.pipeline_version}" in out
    )

    assert main(["datasets", "alpha", "--set", "chunk_size=400"]) == 0
    out = capsys.readouterr().out
    assert "2 document(s) to rebuild" in out and "(nothing changed; add --yes" in out
    assert dataset_row(ctx, "alpha").parse_settings is None

    assert main(["datasets", "alpha", "--set", "chunk_size=400", "--yes", "--json"]) == 0
    change = json.loads(capsys.readouterr().out)
    assert (
        change["applied"]
        and change["reindex"]["queued"] == 2
        and change["after"] == {"chunk_size": 400}
    )

    assert main(["datasets", "alpha", "--json"]) == 0
    view = json.loads(capsys.readouterr().out)
    assert view["settings"][0] == {
        "key": "chunk_size",
        "value": 400,
        "source": "dataset",
        "description": "characters per chunk (100-8000)",
    }
    assert view["documents_to_rebuild"] == 0  # both queued: under way, not behind
    assert view["changed_by"].startswith("cli:")

    assert main(["datasets", "alpha", "--set", "chunk_size"]) == 1
    assert "write KEY=VALUE" in capsys.readouterr().err


def test_a_read_only_operator_may_look_but_not_change(ctx):
    from sluice.ops import actions
    from sluice.ops.access import Operator

    indexed(ctx, ["harbour"], dataset="alpha")
    viewer = Operator(name="viewer", role="readonly")
    change = actions.set_dataset_settings(viewer, "alpha", {"chunk_size": "400"})
    assert not change.ok and "read-only" in change.message
    assert actions.preview_dataset_settings("alpha", {"chunk_size": "400"}).plan.documents == 1
    assert dataset_row(ctx, "alpha").parse_settings is None
    assert {j.status for j in [job(ctx, i) for i in ctx_jobs(ctx)]} == {JobStatus.succeeded}


def test_the_console_page_previews_the_cost_then_saves_and_rebuilds_that_dataset(ctx):
    from tests.support.apptest import assert_ok, open_console, texts

    indexed(ctx, ["harbour", "orchard"], dataset="alpha")
    indexed(ctx, ["meadow"], dataset="beta")
    at = open_console("datasets", query={"dataset": "alpha"})
    page = texts(at)
    assert "Parse settings of alpha" in page and f"Pipeline **{ctx.pipeline_version}**" in page
    assert at.selectbox(key="settings_dataset").value == "alpha"

    at.number_input(key="settings_form:alpha:chunk_size").set_value(400)
    at.selectbox(key="settings_form:alpha:ocr_mode").set_value("off")
    at.button(key="FormSubmitter:settings_form:alpha-Preview the change").click().run()
    assert_ok(at)
    page = texts(at)
    assert "chunk_size = 400, ocr_mode = off" in page and "2 document(s) to rebuild" in page
    assert dataset_row(ctx, "alpha").parse_settings is None  # a preview writes nothing

    at.button(key="apply:alpha").click().run()
    at.button(key="apply:alpha:yes").click().run()
    assert_ok(at)
    assert "now builds pipeline" in texts(at) and "2 document(s) queued for a rebuild" in texts(at)
    assert dataset_row(ctx, "alpha").parse_settings == {"chunk_size": 400, "ocr_mode": "off"}
    assert dataset_row(ctx, "alpha").settings_changed_by.startswith("console:")
    assert dataset_row(ctx, "beta").parse_settings is None
    rows = {r["Setting"]: r for r in at.dataframe[1].value.to_dict("records")}
    assert (rows["chunk_size"]["Value"], rows["chunk_size"]["From"]) == ("400", "this dataset")
    assert rows["chunk_overlap"]["From"] == "default (SLUICE_*)"
