"""The incremental reconcile (issue 43, item 3): a pass over the jobs that changed since the last
repairing one finds exactly what Sluice's own changes left wrong, repairs it, reads only those jobs'
ids, never deletes what a job racing with it claims, and falls back to a full pass without a
checkpoint; a dry run never moves the checkpoint."""

from __future__ import annotations

import time

import numpy as np
import pytest
from sqlmodel import Session, select

from sluice import faults
from sluice.cli.main import main as cli
from sluice.ops.documents import delete_document
from sluice.ops.metadata import set_document_metadata
from sluice.pipeline.reconcile.audit import reconcile
from sluice.pipeline.reconcile.changes import PROBE, fingerprint
from sluice.pipeline.reconcile.snapshot import Snapshot
from sluice.pipeline.running import runner
from sluice.pipeline.running.runner import run_job
from sluice.storage import jobs, reconcile_checkpoints
from sluice.storage.models import Dataset, JobStatus
from sluice.storage.reconcile_checkpoints import ReconcileCheckpoint
from sluice.storage.vectors import chunk_id
from tests.support.big_store import synthetic_store
from tests.support.helpers import collection, ids_of_job, job
from tests.test_races import half_written
from tests.test_reconcile import indexed, sha_of


def checkpoint_row(ctx, name: str = "default") -> ReconcileCheckpoint | None:
    with Session(ctx.engine) as session:
        ds = session.exec(select(Dataset).where(Dataset.name == name)).one()
        return session.get(ReconcileCheckpoint, ds.id)


def by_document(report) -> dict:
    return {f.document_id: f for f in report.findings}


def foreign_chunk(ctx, cid: str = "stray-1") -> None:
    ctx.vectors.collection(collection(ctx)).add(
        ids=[cid],
        embeddings=np.full((1, 384), 0.2, dtype=np.float32),
        documents=["x"],
        metadatas=[{"a": 1}],
    )


class Failing(Exception):
    pass


def test_an_incremental_pass_finds_exactly_what_sluices_own_changes_left_and_repairs_it(
    database_url, make_ctx, monkeypatch
):
    ctx = make_ctx(SLUICE_EMBED_BATCH_SIZE="4")
    done = indexed(ctx, ["harbour", "orchard", "glacier", "meadow", "quarry"])
    harbour, orchard, glacier, meadow, quarry = (done[t] for t in done)
    coll = ctx.vectors.collection(collection(ctx))
    assert reconcile(ctx, repair=True, actor="test").clean  # the checkpoint

    # 1. harbour deleted, its chunks left behind (the vector delete failed)
    with monkeypatch.context() as m:
        m.setattr(ctx.vectors, "delete", lambda *a, **k: (_ for _ in ()).throw(Failing()))
        with pytest.raises(Failing):
            delete_document(ctx, harbour.id, actor="test")
    # 2. orchard reindexed to 2 chunks fewer, the cleanup of the old tail lost
    with Session(ctx.engine) as session:
        assert jobs.reindex(session=session, job_ids=[orchard.id], actor="test")[0].ok
    chunk = runner._chunk
    with monkeypatch.context() as m:
        m.setattr(runner, "_chunk", lambda *a: chunk(*a)[:-2])
        m.setattr(ctx.vectors, "ids_where", lambda *a, **k: [])  # it sees no older chunks
        assert run_job(orchard.id, ctx=ctx).result == "succeeded"
    tail = [
        chunk_id(
            sha_of(ctx, orchard.document_id), orchard.pipeline_version, orchard.chunk_count + p
        )
        for p in (-2, -1)
    ]
    # 3. glacier's metadata changed, the copies on its chunks not rewritten
    with faults.hook("metadata_switched", lambda **_: (_ for _ in ()).throw(Failing())):
        with pytest.raises(Failing):
            set_document_metadata(ctx, glacier.document_id, {"tag": "red"}, actor="test")
    # 4. meadow's metadata changed (and rewritten), then two of its chunks went missing
    set_document_metadata(ctx, meadow.document_id, {"tag": "blue"}, actor="test")
    gone = ids_of_job(ctx, meadow.id)[1:3]
    coll.delete(ids=gone)
    # Behind Sluice's back, of a job that did not change: for a full pass only.
    coll.delete(ids=ids_of_job(ctx, quarry.id)[:1])
    foreign_chunk(ctx)

    check = reconcile(ctx, changed_only=True)

    [summary] = check.datasets
    assert (check.kind, summary.kind, summary.jobs, summary.jobs_checked) == (
        "incremental",
        "incremental",
        5,
        4,
    )
    found = by_document(check)
    assert set(found) == {
        harbour.document_id,
        orchard.document_id,
        glacier.document_id,
        meadow.document_id,
    }, check.describe()
    h, o, g, w = (found[j.document_id] for j in (harbour, orchard, glacier, meadow))
    assert (h.orphans, h.lexical) == (harbour.chunk_count, {"orphans": harbour.chunk_count})
    assert list(h.orphan_sources) == [f"of deleted document {harbour.document_id}"]
    assert sorted(o.orphan_ids) == sorted(tail) and (o.missing, o.mismatched) == (0, 0)
    assert (g.mismatched, g.orphans, g.missing) == (glacier.chunk_count, 0, 0)
    assert g.mismatches[0]["fields"] == {"meta_tag": [None, "red"]}
    assert (w.missing, sorted(w.missing_ids), w.orphans, w.mismatched) == (2, sorted(gone), 0, 0)
    assert "incremental pass over the 4 of 5 job(s)" in check.describe()
    assert check.notes and "full pass" in check.notes[0]

    repaired = reconcile(ctx, repair=True, actor="test", changed_only=True)

    assert repaired.problems == check.problems and not repaired.errors, repaired.describe()
    assert repaired.queued == [meadow.id]
    assert ids_of_job(ctx, harbour.id) == [] and coll.get(ids=tail)["ids"] == []
    metas = coll.get(ids=ids_of_job(ctx, glacier.id))["metadatas"]
    assert {m.get("meta_tag") for m in metas} == {"red"}
    assert run_job(meadow.id, ctx=ctx).result == "succeeded"

    again = reconcile(ctx, repair=True, actor="test", changed_only=True)
    assert again.clean and again.problems == 0, again.describe()
    assert again.datasets[0].jobs_checked == 1  # meadow's rebuild changed it once more
    assert reconcile(ctx, changed_only=True).datasets[0].jobs_checked == 0

    # What the incremental pass cannot see, a full one finds.
    full = reconcile(ctx)
    assert (full.missing, full.orphans) == (1, 1) and set(by_document(full)) == {
        quarry.document_id,
        None,
    }


class Counting:
    """The vector store, counting what a pass asks of it."""

    def __init__(self, store) -> None:
        self.store, self.ids, self.requests, self.pages = store, 0, 0, 0

    def get(self, name, ids, include=None):
        self.ids += len(ids)
        self.requests += 1
        return self.store.get(name, ids, include=include)

    def iter_pages(self, *args, **kwargs):
        for page in self.store.iter_pages(*args, **kwargs):
            self.pages += 1
            yield page

    def __getattr__(self, name):
        return getattr(self.store, name)


def test_an_incremental_pass_asks_only_for_the_ids_of_the_documents_that_changed(ctx):
    """20,000 chunks, one document of 1,000 changed: the pass asks for about its ids, never a
    page of the collection."""
    name, made = synthetic_store(ctx, documents=20, chunks_each=1000)
    with Session(ctx.engine) as session:  # what a full repairing pass leaves (its recall check
        snap = Snapshot(session, made[0].dataset_id)  # would rebuild these 2-d random vectors)
        reconcile_checkpoints.save(
            session, made[0].dataset_id, name, fingerprint(snap), full=True, actor="test"
        )
    changed = made[7]
    set_document_metadata(ctx, changed.document_id, {"tag": "red"}, actor="test")
    store = ctx.vectors
    counting = ctx.__dict__["vectors"] = Counting(store)
    try:
        report = reconcile(ctx, dataset="big", save=False, changed_only=True)
    finally:
        ctx.__dict__["vectors"] = store

    [summary] = report.datasets
    assert (report.missing, report.orphans, report.mismatched) == (0, 0, 0), report.describe()
    assert summary.lexical_missing == 1000  # the synthetic store has no word index: asked the same
    assert (summary.kind, summary.jobs, summary.jobs_checked) == ("incremental", 20, 1)
    assert (summary.chunks, summary.present, summary.expected) == (1000, 1000, 1000)
    assert counting.pages == 0  # no walk
    assert summary.ids_asked == counting.ids == 1000 + PROBE, counting.ids
    assert counting.requests <= 3
    ctx.vectors.drop_collection(name)


def test_a_retry_landing_before_an_incremental_repairs_delete_keeps_every_chunk(
    database_url, make_ctx
):
    """The failed job has no chunk count: its chunks are found by the probe past position 0, and
    the retry that lands between the confirmation and the delete keeps them all, as for a full
    pass."""
    ctx = make_ctx(SLUICE_EMBED_BATCH_SIZE="2")
    indexed(ctx, ["meadow"])
    assert reconcile(ctx, repair=True, actor="test").clean
    job_id, written = half_written(ctx)
    asked: list[list[str]] = []

    def operator_retries_and_the_job_runs(ids, **_) -> None:
        asked.append(ids)
        assert set(written) <= set(ids)  # the repair is about to delete the first attempt's chunks
        with Session(ctx.engine) as session:
            assert jobs.retry(session=session, job_ids=[job_id], actor="op")[0].ok
        assert run_job(job_id, ctx=ctx).result == "succeeded"

    with faults.hook("reconcile_before_delete", operator_retries_and_the_job_runs):
        report = reconcile(ctx, repair=True, actor="test", changed_only=True)

    assert asked and report.kind == "incremental" and report.orphans == len(written)
    j = job(ctx, job_id)
    assert j.status == JobStatus.succeeded
    assert len(ids_of_job(ctx, job_id)) == j.chunk_count  # search misses nothing
    assert reconcile(ctx, changed_only=True).clean
    assert reconcile(ctx).clean


def test_a_job_that_runs_while_an_incremental_repairs_delete_is_in_flight_is_rebuilt(
    database_url, make_ctx, monkeypatch
):
    ctx = make_ctx(SLUICE_EMBED_BATCH_SIZE="2")
    indexed(ctx, ["meadow"])
    assert reconcile(ctx, repair=True, actor="test").clean
    job_id, written = half_written(ctx)
    sent = ctx.vectors.delete

    def the_operator_retries_while_it_is_under_way(name, *, ids=None, where=None):
        if ids is not None and set(written) <= set(ids):
            monkeypatch.setattr(ctx.vectors, "delete", sent)
            with Session(ctx.engine) as session:
                assert jobs.retry(session=session, job_ids=[job_id], actor="op")[0].ok
            assert run_job(job_id, ctx=ctx).result == "succeeded"  # it counted on the 6 ids
        return sent(name, ids=ids, where=where)

    monkeypatch.setattr(ctx.vectors, "delete", the_operator_retries_while_it_is_under_way)
    report = reconcile(ctx, repair=True, actor="test", changed_only=True)

    assert report.kind == "incremental" and report.queued == [job_id], report.describe()
    assert run_job(job_id, ctx=ctx).result == "succeeded"
    assert len(ids_of_job(ctx, job_id)) == job(ctx, job_id).chunk_count
    assert reconcile(ctx, changed_only=True).clean and reconcile(ctx).clean


def test_without_a_checkpoint_it_is_a_full_pass_and_a_dry_run_never_moves_one(
    database_url, make_ctx
):
    ctx = make_ctx()
    done = indexed(ctx, ["tundra", "steppe"])
    foreign_chunk(ctx)

    dry = reconcile(ctx, changed_only=True)
    assert (dry.kind, dry.orphans) == ("full", 1)
    assert dry.datasets[0].why_full.startswith("no checkpoint yet")
    assert "(no checkpoint yet" in dry.describe() and dry.blobs_checked == 2
    assert checkpoint_row(ctx) is None  # a dry run saves none

    repaired = reconcile(ctx, repair=True, actor="test", changed_only=True)
    assert (repaired.kind, repaired.orphans) == ("full", 1) and not repaired.errors
    saved = checkpoint_row(ctx)
    assert saved is not None and saved.jobs == 2 and saved.full_at is not None

    set_document_metadata(ctx, done["tundra"].document_id, {"tag": "red"}, actor="test")
    for _ in range(2):
        looked = reconcile(ctx, changed_only=True)
        assert (looked.kind, looked.datasets[0].jobs_checked) == ("incremental", 1)
        assert looked.blobs_checked == 0  # the blob audit is a full pass's
        row = checkpoint_row(ctx)
        assert (row.saved_at, row.fingerprint) == (saved.saved_at, saved.fingerprint)

    # The periodic task's rule: a full pass when the last one is older than the setting.
    assert reconcile(ctx, changed_only=True, full_every_hours=24).kind == "incremental"
    aged = reconcile(ctx, changed_only=True, full_every_hours=0)
    assert aged.kind == "full" and "older than 0 h" in aged.datasets[0].why_full
    # A checkpoint of another collection (the index was rebuilt) is no base for a pass.
    with Session(ctx.engine) as session:
        row = session.get(ReconcileCheckpoint, saved.dataset_id)
        row.collection = "sluice-elsewhere"
        session.add(row)
        session.commit()
    moved = reconcile(ctx, changed_only=True)
    assert moved.kind == "full" and "collection" in moved.datasets[0].why_full


def test_the_checkpoint_round_trips_and_forgets_deleted_datasets(ctx):
    entries = {"a" * 32 + "-v1-": (b"\x01" * 8, 12), "b" * 32 + "-v1-": (b"\x02" * 8, 0)}
    assert reconcile_checkpoints.decode(reconcile_checkpoints.encode(entries)) == entries
    with Session(ctx.engine) as session:
        reconcile_checkpoints.save(session, 10**6, "gone", entries, full=True, actor="t")
        ds_id = session.exec(select(Dataset)).first().id
        reconcile_checkpoints.save(session, ds_id, "c", entries, full=False, actor="t")
        assert session.get(ReconcileCheckpoint, 10**6) is None  # no such dataset: dropped
        got = reconcile_checkpoints.load(session, ds_id)
    assert got is not None and got.entries == entries and got.full_at is None


def test_cli_reconcile_changed_and_the_periodic_task(make_ctx, capsys, monkeypatch):
    from sluice.pipeline.reconcile.report import last_report
    from sluice.worker.hooks import periodic_reconcile

    ctx = make_ctx(SLUICE_RECONCILE_INTERVAL_MINUTES="1", SLUICE_RECONCILE_FULL_HOURS="24")
    indexed(ctx, ["prairie"])
    assert cli(["reconcile", "--changed"]) == 0
    assert "full pass over 1 job(s) (no checkpoint yet" in capsys.readouterr().out

    periodic_reconcile.call_local()  # no checkpoint: a full pass, which saves one
    assert last_report(ctx)["kind"] == "full" and checkpoint_row(ctx) is not None
    periodic_reconcile.call_local()
    assert last_report(ctx)["kind"] == "incremental"

    assert cli(["reconcile", "--changed"]) == 0
    out = capsys.readouterr().out
    assert "incremental pass over the 0 of 1 job(s)" in out and "clean: the chunks" in out


def test_console_checks_what_changed(make_ctx):
    import streamlit as st

    from tests.support.apptest import assert_ok, open_console, texts

    st.cache_resource.clear()  # the panel's background runner is per process
    ctx = make_ctx()
    indexed(ctx, ["lagoon"])
    assert reconcile(ctx, repair=True, actor="test").clean

    at = open_console("integrity")
    at.button(key="reconcile_changed").click().run()
    deadline = time.monotonic() + 120  # a loaded machine runs the pass slowly
    while "that changed since the last repair" not in texts(at) and time.monotonic() < deadline:
        time.sleep(0.1)
        at.run()
    assert_ok(at)
    assert "the chunks of 0 jobs that changed since the last repair" in texts(at)
    assert "Clean: what changed since the last repair" in texts(at)
