"""Renaming and deleting a dataset (sluice.ops.dataset_admin): a rename keeps search, jobs and
scoped API keys working; a delete removes everything of the dataset and nothing of the others, also
while one of its jobs runs on a real worker, and a delete killed halfway is finished by running it
again."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text
from sqlmodel import Session, select

from sluice import faults
from sluice.api import authentication, scoped
from sluice.cli.main import main as cli
from sluice.ops import dataset_admin, keys
from sluice.ops.access import LOCAL_OPERATOR, Operator
from sluice.ops.ingest import ingest_bytes
from sluice.ops.search import DatasetDeleting, UnknownDataset, search
from sluice.pipeline.reconcile.audit import reconcile
from sluice.pipeline.running.runner import run_job
from sluice.storage.models import ApiKey, Dataset, Document, Job
from tests.support.api_server import InProcessApi, auth, make_key
from tests.support.helpers import Background, collection, job, until

ALPHA = b"Albatross migration routes cross the southern ocean every winter season. " * 40
BETA = b"Beekeeping starts with a calm hive, a smoker and patient hands in spring. " * 40
SHARED = b"Cartographers drew the harbour twice: once at low tide, once at high tide. " * 40


def indexed(ctx, data: bytes, dataset: str, filename: str):
    r = ingest_bytes(ctx, data, dataset=dataset, filename=filename)
    assert run_job(r.job_id, ctx=ctx).result == "succeeded"
    return r


def dataset_row(ctx, name: str) -> Dataset | None:
    with Session(ctx.engine) as session:
        return session.exec(select(Dataset).where(Dataset.name == name)).first()


def lexical_rows(ctx, dataset_id: int) -> int:
    with ctx.engine.connect() as conn:
        return conn.execute(
            text("SELECT count(*) FROM lexical_chunk WHERE dataset_id = :d"), {"d": dataset_id}
        ).scalar_one()


def collection_exists(ctx, name: str) -> bool:
    try:
        ctx.vectors.client.get_collection(name)
    except Exception as exc:
        assert type(exc).__name__ == "NotFoundError" or "does not exist" in str(exc), exc
        return False
    return True


def assert_gone(ctx, name: str, dataset_id: int, coll: str, blob: str) -> None:
    assert dataset_row(ctx, name) is None
    assert not collection_exists(ctx, coll)
    assert lexical_rows(ctx, dataset_id) == 0
    assert not ctx.blobs.exists(blob)
    with Session(ctx.engine) as session:
        assert not session.exec(select(Job).where(Job.dataset_id == dataset_id)).all()
        assert not session.exec(select(Document).where(Document.dataset_id == dataset_id)).all()


def test_a_rename_keeps_search_jobs_and_scoped_keys_working(ctx):
    done = indexed(ctx, ALPHA, "alpha", "albatross.txt")
    waiting = ingest_bytes(ctx, BETA, dataset="alpha", filename="bees.txt")  # queued, not yet run
    _, token = keys.create_key(LOCAL_OPERATOR, "alpha-reader", datasets=["alpha"], scope="read")
    before = dataset_row(ctx, "alpha")

    result = dataset_admin.rename(ctx, LOCAL_OPERATOR, "alpha", "birds")
    assert result.ok, result.message
    after = dataset_row(ctx, "birds")
    assert (after.id, after.collection) == (before.id, before.collection)  # the row, renamed
    assert dataset_row(ctx, "alpha") is None
    hits = search(ctx, query="albatross migration", dataset="birds", k=3)
    assert hits and hits[0].document_id == done.document_id
    with pytest.raises(UnknownDataset):
        search(ctx, query="albatross", dataset="alpha")
    assert run_job(waiting.job_id, ctx=ctx).result == "succeeded"  # the queued job, renamed under
    key = authentication.authenticate(token)
    assert key is not None and [d["name"] for d in scoped.datasets(key)] == ["birds"]
    assert scoped.dataset(key, "birds")["documents"] == 2
    assert reconcile(ctx).clean

    # refusals, each with its code; nothing changes
    indexed(ctx, SHARED, "maps", "maps.txt")
    assert dataset_admin.rename(ctx, LOCAL_OPERATOR, "nope", "x").code == "unknown_dataset"
    assert dataset_admin.rename(ctx, LOCAL_OPERATOR, "birds", "maps").code == "dataset_name_taken"
    assert dataset_admin.rename(ctx, LOCAL_OPERATOR, "birds", "`x`").code == "invalid_dataset_name"
    reader = Operator("ro", "readonly")
    assert dataset_admin.rename(ctx, reader, "birds", "fowl").code == "read_only"
    assert dataset_row(ctx, "birds") is not None


def test_a_delete_removes_everything_of_the_dataset_and_nothing_else(ctx, capsys):
    a = indexed(ctx, ALPHA, "alpha", "albatross.txt")
    shared_a = indexed(ctx, SHARED, "alpha", "maps.txt")
    b = indexed(ctx, BETA, "beta", "bees.txt")
    shared_b = indexed(ctx, SHARED, "beta", "maps.txt")  # the same bytes: one blob for both
    keys.create_key(LOCAL_OPERATOR, "both", datasets=["alpha", "beta"], scope="manage")
    ds = dataset_row(ctx, "alpha")
    with Session(ctx.engine) as session:
        blob = session.get(Document, a.document_id).blob_key
        shared_blob = session.get(Document, shared_a.document_id).blob_key

    assert cli(["datasets", "delete", "alpha"]) == 0  # without --yes: what would go
    out = capsys.readouterr().out
    assert "2 document(s)" in out and "nothing deleted" in out
    assert dataset_row(ctx, "alpha") is not None
    assert cli(["datasets", "delete", "alpha", "--yes"]) == 0
    assert "deleted" in capsys.readouterr().out

    assert_gone(ctx, "alpha", ds.id, ds.collection, blob)
    assert ctx.blobs.exists(shared_blob)  # beta's maps.txt still uses it
    with Session(ctx.engine) as session:
        assert session.exec(select(ApiKey)).one().dataset_ids == [dataset_row(ctx, "beta").id]
    assert {h.document_id for h in search(ctx, query="hive smoker", dataset="beta")} >= {
        b.document_id
    }
    assert search(ctx, query="harbour tide", dataset="beta")[0].document_id == shared_b.document_id
    assert reconcile(ctx).clean
    assert cli(["datasets", "delete", "alpha", "--yes"]) == 1  # gone: a clear refusal
    assert "no dataset named 'alpha'" in capsys.readouterr().err


@pytest.mark.slow
def test_a_delete_while_its_job_runs_on_a_real_worker(ctx, start_worker, tmp_path):
    release = tmp_path / "release"
    start_worker(env={"SLUICE_FAULTS": f"after_parse=wait:{release}"})
    r = ingest_bytes(ctx, ALPHA * 10, dataset="alpha", filename="long.txt")
    until(lambda: Path(f"{release}.waiting").exists(), timeout=60, what="the job parsed")
    ds = dataset_row(ctx, "alpha")
    with Session(ctx.engine) as session:
        blob = session.get(Document, r.document_id).blob_key
    deleting = Background(lambda: dataset_admin.delete(ctx, LOCAL_OPERATOR, "alpha", wait=60))
    deleting.start()
    try:
        until(lambda: job(ctx, r.job_id).cancel_requested, timeout=30, what="the cancel asked")
        assert ingest_bytes(ctx, BETA, dataset="alpha", filename="late.txt").error_code == (
            "dataset_deleting"
        )
    finally:
        release.touch()
    result = deleting.result(timeout=90)
    assert result.ok, result.message
    assert_gone(ctx, "alpha", ds.id, ds.collection, blob)
    assert reconcile(ctx).clean


def test_a_delete_killed_halfway_refuses_uploads_and_search_and_a_rerun_finishes_it(
    ctx, sluice_env, capsys
):
    indexed(ctx, ALPHA, "alpha", "albatross.txt")
    indexed(ctx, BETA, "alpha", "bees.txt")
    ds = dataset_row(ctx, "alpha")
    with Session(ctx.engine) as session:
        blobs = [d.blob_key for d in session.exec(select(Document)).all()]
    # killed (like kill -9) after its first document went
    env = {**sluice_env, "SLUICE_FAULTS": "dataset_delete_document=exit"}
    done = subprocess.run(
        [sys.executable, "-m", "sluice.cli", "datasets", "delete", "alpha", "--yes"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    half = dataset_row(ctx, "alpha")
    assert half is not None and half.deleting_at is not None
    with Session(ctx.engine) as session:
        live = session.exec(select(Document).where(Document.deleted_at.is_(None))).all()
    assert len(live) == 1  # halfway: one document of two removed
    refused = ingest_bytes(ctx, SHARED, dataset="alpha", filename="maps.txt")
    assert (refused.accepted, refused.error_code) == (False, "dataset_deleting")
    with pytest.raises(DatasetDeleting):
        search(ctx, query="hive", dataset="alpha")
    assert cli(["search", "hive"]) == 0  # over all datasets: the one being deleted is left out

    # recovery finishes it (a rerun of the delete does the same steps)
    capsys.readouterr()
    assert cli(["recover"]) == 0
    assert json.loads(capsys.readouterr().out)["datasets_deleted"] == 1
    for blob in blobs:
        assert_gone(ctx, "alpha", ds.id, ds.collection, blob)
    assert dataset_admin.finish_deletions(ctx) == []
    assert reconcile(ctx).clean


def test_a_delete_that_fails_at_the_collection_is_finished_by_a_rerun(ctx, monkeypatch):
    r = indexed(ctx, ALPHA, "alpha", "albatross.txt")
    ds = dataset_row(ctx, "alpha")
    with Session(ctx.engine) as session:
        blob = session.get(Document, r.document_id).blob_key

    def chroma_down(**_):
        raise ConnectionError("chroma went away")

    with faults.hook("dataset_delete_documents_removed", chroma_down):
        with pytest.raises(ConnectionError):
            dataset_admin.delete(ctx, LOCAL_OPERATOR, "alpha")
    assert dataset_row(ctx, "alpha").deleting_at is not None
    assert collection_exists(ctx, collection(ctx, "alpha"))
    again = dataset_admin.delete(ctx, LOCAL_OPERATOR, "alpha")
    assert again.ok, again.message
    assert_gone(ctx, "alpha", ds.id, ds.collection, blob)


def test_the_api_renames_and_deletes_with_the_manage_scope(database_url, sluice_env):
    from sluice.pipeline.running.context import get_context

    ctx = get_context()
    indexed(ctx, ALPHA, "alpha", "albatross.txt")
    indexed(ctx, BETA, "beta", "bees.txt")
    manage = make_key("m", datasets=["alpha"], scope="manage")
    read = make_key("r", datasets=["alpha"], scope="read")
    with InProcessApi() as api:
        url = f"{api.url}/v1/datasets"

        def patch(name, body, token=manage):
            return httpx.patch(f"{url}/{name}", json=body, headers=auth(token), timeout=30)

        def problem(resp, status, code):
            assert resp.status_code == status, resp.text
            assert resp.headers["content-type"].startswith("application/problem+json")
            assert resp.json()["code"] == code, resp.json()

        problem(patch("alpha", {"name": "birds"}, read), 403, "scope_missing")
        problem(patch("beta", {"name": "x"}), 404, "not_found")  # not this key's dataset
        problem(patch("nope", {"name": "x"}), 404, "not_found")
        problem(patch("alpha", {"name": "beta"}), 409, "dataset_name_taken")
        problem(patch("alpha", {"name": "`x`"}), 422, "invalid_dataset_name")
        problem(patch("alpha", {"nom": "x"}), 422, "invalid_request")
        ok = patch("alpha", {"name": "birds"})
        assert ok.status_code == 200, ok.text
        assert ok.json()["dataset"]["name"] == "birds"
        # the key names the dataset by id: it reaches the renamed one
        got = httpx.get(f"{url}/birds", headers=auth(read), timeout=30)
        assert got.status_code == 200 and got.json()["documents"] == 1
        hits = httpx.post(
            f"{api.url}/v1/datasets/birds/search",
            json={"query": "albatross"},
            headers=auth(read),
            timeout=30,
        )
        assert hits.status_code == 200, hits.text

        problem(httpx.delete(f"{url}/birds", headers=auth(read), timeout=30), 403, "scope_missing")
        gone = httpx.delete(f"{url}/birds", headers=auth(manage), timeout=60)
        assert gone.status_code == 200, gone.text
        problem(httpx.delete(f"{url}/birds", headers=auth(manage), timeout=30), 404, "not_found")
    assert dataset_row(ctx, "birds") is None and dataset_row(ctx, "beta") is not None


def test_the_datasets_page_renames_and_deletes_after_the_name_is_typed(ctx):
    from tests.support.apptest import assert_ok, open_console, texts

    indexed(ctx, ALPHA, "alpha", "albatross.txt")
    indexed(ctx, BETA, "beta", "bees.txt")
    at = open_console("datasets", query={"dataset": "alpha"})
    assert "dataset 'alpha': 1 document(s) and" in texts(
        at
    )  # what a delete removes, before it is asked
    at.text_input(key="rename_to:alpha").set_value("beta")
    at.button(key="FormSubmitter:rename:alpha-Rename").click().run()
    assert_ok(at)
    assert "a dataset named 'beta' exists" in texts(at)
    at.text_input(key="rename_to:alpha").set_value("birds")
    at.button(key="FormSubmitter:rename:alpha-Rename").click().run()
    assert_ok(at)
    assert dataset_row(ctx, "birds") is not None and "now called 'birds'" in texts(at)

    at.text_input(key="delete_name:birds").set_value("bird")  # not the name: nothing happens
    at.button(key="FormSubmitter:delete:birds-Delete the dataset").click().run()
    assert_ok(at)
    assert "nothing was deleted" in texts(at) and dataset_row(ctx, "birds") is not None
    at.text_input(key="delete_name:birds").set_value("birds")
    at.button(key="FormSubmitter:delete:birds-Delete the dataset").click().run()
    assert_ok(at)
    assert dataset_row(ctx, "birds") is None and "dataset 'birds' deleted" in texts(at)
    assert dataset_row(ctx, "beta") is not None


def test_a_late_read_or_delete_of_a_dropped_collection_does_not_make_it_again(ctx):
    """A worker whose job was stopped by a dataset delete may still delete its chunks, and a search
    or an audit may still read, after the delete dropped the collection: none of them may make it
    again (before: every call looked its collection up with get_or_create, and a dataset deleted
    while its job ran could be left with an empty collection of its name, which reconcile then
    reported)."""
    indexed(ctx, ALPHA, "alpha", "a.txt")
    name = dataset_row(ctx, "alpha").collection
    assert ctx.vectors.count(name) > 0
    cid = ctx.vectors.window(name, offset=0, limit=1)[0]
    ctx.vectors.drop_collection(name)
    stale = type(ctx.vectors).from_settings(ctx.settings)  # another process's view: a held handle
    stale.collection(name)  # it holds a handle of the collection, which is then dropped
    ctx.vectors.drop_collection(name)
    for store in (ctx.vectors, stale):
        store.delete(name, ids=[cid])
        store.delete(name, where={"document_id": 1})
        assert store.get(name, [cid]) == {"ids": [], "metadatas": []}
        assert store.count(name) == 0
        assert store.window(name, offset=0, limit=5) == []
        assert list(store.iter_pages(name)) == []
        assert store.query(name, [0.0] * 384, n=3) == []
        assert store.query_ids(name, [[0.0] * 384], n=3) == [[]]
        assert store.set_metadata_fields(name, [cid], {"k": "v"}) == 0
        assert not collection_exists(ctx, name)


def test_a_dataset_that_a_source_follows_is_deleted_with_its_sources(ctx, tmp_path, capsys):
    """Before: the delete failed on the sources' foreign keys (a 500, a traceback), the dataset
    stayed "deleting" for good and recovery stopped at it."""
    from sluice.ops.sources import syncing
    from sluice.storage.source_records import Source, SourceEntry, SourceRun

    folder = tmp_path / "share"
    folder.mkdir()
    (folder / "a.txt").write_bytes(ALPHA)
    syncing.add_source(ctx, name="share", dataset="alpha", folder=str(folder))
    assert syncing.sync(ctx, "share", actor="test", confirm=True).counts["added"] == 1
    indexed(ctx, BETA, "beta", "bees.txt")
    syncing.add_source(ctx, name="other", dataset="beta", folder=str(folder))
    with Session(ctx.engine) as session:
        ids = {s.name: s.id for s in session.exec(select(Source)).all()}
        assert session.exec(select(SourceEntry).where(SourceEntry.source_id == ids["share"])).all()
    assert cli(["datasets", "delete", "alpha", "--yes"]) == 0, capsys.readouterr().err
    assert dataset_row(ctx, "alpha") is None
    with Session(ctx.engine) as session:
        assert [s.name for s in session.exec(select(Source)).all()] == ["other"]
        for table in (SourceEntry, SourceRun):
            assert not session.exec(select(table).where(table.source_id == ids["share"])).all()
