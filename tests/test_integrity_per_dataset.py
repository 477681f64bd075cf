"""Integrity and reindex judge each dataset by its own pipeline version and show only its own
check (issue 27, item 5): the CLI's reindex dry run, the Integrity page over all datasets and over
one, a dataset with chunking of its own."""

from __future__ import annotations

from sqlmodel import Session, select

from tests.support.apptest import open_console, texts
from tests.support.helpers import run_file


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
