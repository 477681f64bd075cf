"""Reconcile against a real Chroma server: problems made behind the system's back are found exactly,
repaired, and a second run is clean; leftovers of cancelled, failed and crashed runs are orphans."""

import json
import time

import numpy as np
import pytest
from sqlmodel import Session

from sluice.cli.main import main as cli
from sluice.ops.ingest import ingest_bytes
from sluice.pipeline.reconcile.audit import reconcile
from sluice.pipeline.running.runner import run_job
from sluice.storage import jobs
from sluice.storage.models import Document, JobStatus
from sluice.storage.vectors import chunk_id
from tests.support.big_store import (
    ALIENS,
    MISSING,
    add_problems,
    synthetic_store,
    traced_reconcile,
)
from tests.support.helpers import Background, collection, events, ids_of_job, job, wait_for


def text(topic: str, paragraphs: int = 6) -> bytes:
    return "".join(
        f"{topic} note {i}: the {topic} section {i} explains {topic} matters in plain words. " * 6
        + "\n\n"
        for i in range(paragraphs)
    ).encode()


def indexed(ctx, topics, dataset="default"):
    """Upload one text document per topic and run its job here; returns {topic: job}."""
    out = {}
    for topic in topics:
        r = ingest_bytes(ctx, text(topic), dataset=dataset, filename=f"{topic}.txt")
        assert run_job(r.job_id, ctx=ctx).result == "succeeded"
        out[topic] = job(ctx, r.job_id)
    return out


def sha_of(ctx, document_id):
    with Session(ctx.engine) as session:
        return session.get(Document, document_id).sha256


def test_three_problems_made_behind_its_back_are_found_exactly_and_repaired(database_url, ctx):
    done = indexed(ctx, ["harbour", "orchard", "glacier"])
    coll = ctx.vectors.collection(collection(ctx))
    harbour, orchard, glacier = done["harbour"], done["orchard"], done["glacier"]
    assert harbour.chunk_count >= 4

    # 1. two of harbour's chunks vanish from Chroma
    sha = sha_of(ctx, harbour.document_id)
    gone = [chunk_id(sha, harbour.pipeline_version, p) for p in (1, 3)]
    coll.delete(ids=gone)
    # 2. three chunks nobody made
    foreign = [f"stray-{i}" for i in range(3)]
    coll.add(
        ids=foreign,
        embeddings=np.full((3, 384), 0.05, dtype=np.float32),
        documents=["stray"] * 3,
        metadatas=[{"job_id": 99999, "document_id": 99999}] * 3,
    )
    # 3. one of orchard's chunks claims another document
    tampered = ids_of_job(ctx, orchard.id)[2]
    coll.update(ids=[tampered], metadatas=[{"document_id": glacier.document_id}])

    report = reconcile(ctx)

    assert not report.clean and report.problems == 2 + 3 + 1
    by_doc = {f.document_id: f for f in report.findings}
    assert set(by_doc) == {harbour.document_id, orchard.document_id, None}
    h, o, stray = by_doc[harbour.document_id], by_doc[orchard.document_id], by_doc[None]
    assert (h.missing, h.orphans, h.mismatched) == (2, 0, 0) and sorted(h.missing_ids) == sorted(
        gone
    )
    assert (stray.missing, stray.orphans, stray.mismatched) == (0, 3, 0)
    assert sorted(stray.orphan_ids) == foreign and list(stray.orphan_sources) == [
        "foreign: no job of this dataset makes this id"
    ]
    assert (o.missing, o.orphans, o.mismatched) == (0, 0, 1)
    assert o.mismatches == [
        {"id": tampered, "fields": {"document_id": [glacier.document_id, orchard.document_id]}}
    ]
    assert h.repair == [
        f"reindex job {harbour.id}: the re-run adds the 2 missing chunk(s) from the embedding cache"
    ]
    assert job(ctx, harbour.id).status == JobStatus.succeeded  # a dry run changes nothing
    assert coll.count() == sum(j.chunk_count for j in done.values()) - 2 + 3

    repaired = reconcile(ctx, repair=True, actor="test")

    assert repaired.problems == 6 and not repaired.errors
    assert repaired.queued == [harbour.id]
    assert coll.get(ids=foreign)["ids"] == []
    assert coll.get(ids=[tampered])["metadatas"][0]["document_id"] == orchard.document_id
    kinds = [e.kind for e in events(ctx, orchard.id)]
    assert kinds[-1] == "reconcile_repair"
    rebuild = [e for e in events(ctx, harbour.id) if e.kind == "reindex_requested"]
    assert (
        len(rebuild) == 1
        and "2 chunk(s) missing" in rebuild[0].message
        and rebuild[0].actor == "test"
    )

    # Repair is idempotent: while the rebuild waits, a second repair queues nothing more.
    again = reconcile(ctx, repair=True, actor="test")
    assert (
        again.clean
        and again.queued == []
        and again.datasets[0].in_flight == harbour.chunk_count - 2
    )

    assert run_job(harbour.id, ctx=ctx).result == "succeeded"
    rebuilt = job(ctx, harbour.id)
    assert (rebuilt.embedded_count, rebuilt.cached_count) == (
        0,
        2,
    )  # only the missing, from the cache
    assert len(ids_of_job(ctx, harbour.id)) == harbour.chunk_count

    final = reconcile(ctx)
    assert final.clean, final.describe()
    assert (
        final.datasets[0].present
        == final.datasets[0].expected
        == sum(j.chunk_count for j in done.values())
    )


def test_leftovers_of_failed_and_cancelled_runs_are_orphans_and_repaired(
    database_url, make_ctx, monkeypatch
):
    ctx = make_ctx(SLUICE_EMBED_BATCH_SIZE="4", SLUICE_MAX_ATTEMPTS="3")
    keep = indexed(ctx, ["meadow"])["meadow"]

    # A permanent failure after the first batch was written: the failed job's chunks stay behind.
    monkeypatch.setenv("SLUICE_FAULTS", "embed_batch=permanent")
    failed = ingest_bytes(ctx, text("quarry"), dataset="default", filename="quarry.txt")
    assert run_job(failed.job_id, ctx=ctx).result == "failed"
    # A transient failure, then the operator cancels the job while it waits for its retry.
    monkeypatch.setenv("SLUICE_FAULTS", "embed_batch=transient")
    cancelled = ingest_bytes(ctx, text("lagoon"), dataset="default", filename="lagoon.txt")
    assert run_job(cancelled.job_id, ctx=ctx).result == "retrying"
    monkeypatch.delenv("SLUICE_FAULTS")
    with Session(ctx.engine) as session:
        assert jobs.request_cancel(session=session, job_ids=[cancelled.job_id], actor="test")[0].ok
    left_failed, left_cancelled = ids_of_job(ctx, failed.job_id), ids_of_job(ctx, cancelled.job_id)
    assert len(left_failed) == len(left_cancelled) == 4

    report = reconcile(ctx)

    by_doc = {f.document_id: f for f in report.findings}
    assert set(by_doc) == {failed.document_id, cancelled.document_id}
    assert by_doc[failed.document_id].orphan_sources == {f"left by failed job {failed.job_id}": 4}
    assert by_doc[cancelled.document_id].orphan_sources == {
        f"left by cancelled job {cancelled.job_id}": 4
    }
    assert report.missing == report.mismatched == 0

    reconcile(ctx, repair=True, actor="test")

    assert ids_of_job(ctx, failed.job_id) == ids_of_job(ctx, cancelled.job_id) == []
    assert len(ids_of_job(ctx, keep.id)) == keep.chunk_count
    note = [e for e in events(ctx, failed.job_id) if e.kind == "reconcile_repair"]
    assert note and note[0].data == {"orphans_removed": 4}
    assert reconcile(ctx).clean


def test_running_jobs_chunks_are_not_orphans(make_ctx, monkeypatch):
    ctx = make_ctx(SLUICE_EMBED_BATCH_SIZE="4")
    monkeypatch.setenv("SLUICE_FAULTS", "embed_batch=transient")
    r = ingest_bytes(ctx, text("canyon"), dataset="default", filename="canyon.txt")
    assert (
        run_job(r.job_id, ctx=ctx).result == "retrying"
    )  # 4 chunks written, the retry will reuse them
    monkeypatch.delenv("SLUICE_FAULTS")

    report = reconcile(ctx, repair=True, actor="test")

    assert report.clean and report.datasets[0].in_flight == 4
    assert len(ids_of_job(ctx, r.job_id)) == 4


def test_repair_running_alongside_new_jobs_never_touches_their_chunks(make_ctx, monkeypatch):
    """Jobs are created, run and switched while repairs walk the store in tiny pages: no report may
    call anything missing or orphaned, and nothing the jobs wrote may go."""
    ctx = make_ctx(SLUICE_EMBED_BATCH_SIZE="2")
    monkeypatch.setenv("SLUICE_FAULTS", "embed_batch=sleep:0.1")
    topics = ["ridge", "marsh", "cove", "dune", "fjord", "mesa"]
    made: list[int] = []

    def produce():
        for topic in topics:
            r = ingest_bytes(ctx, text(topic), dataset="default", filename=f"{topic}.txt")
            made.append(r.job_id)
            run_job(r.job_id, ctx=ctx)

    producer = Background(produce, name="producer")
    producer.start()
    reports = []
    while producer.is_alive() or not reports:
        reports.append(reconcile(ctx, repair=True, actor="test", page_size=3, save=False))
    producer.result()

    assert len(reports) > 1
    assert [(r.missing, r.orphans, r.mismatched, r.queued, r.errors) for r in reports] == [
        (0, 0, 0, [], [])
    ] * len(reports)
    for jid in made:
        j = job(ctx, jid)
        assert j.status == JobStatus.succeeded and len(ids_of_job(ctx, jid)) == j.chunk_count
    assert reconcile(ctx).clean


def test_superseded_and_beyond_count_leftovers_and_deleted_documents(ctx):
    done = indexed(ctx, ["river", "summit"])
    river, summit = done["river"], done["summit"]
    coll = ctx.vectors.collection(collection(ctx))
    sha = sha_of(ctx, river.document_id)
    # A chunk past the end of river's job (an older run made more chunks and the cleanup was lost).
    beyond = chunk_id(sha, river.pipeline_version, river.chunk_count)
    coll.add(
        ids=[beyond],
        embeddings=np.full((1, 384), 0.1, dtype=np.float32),
        documents=["old tail"],
        metadatas=[
            {
                "job_id": river.id,
                "document_id": river.document_id,
                "pipeline_version": river.pipeline_version,
                "position": river.chunk_count,
            }
        ],
    )
    # Summit's document is deleted in the database only, as if the vector delete had failed.
    with Session(ctx.engine) as session:
        assert all(
            r.ok
            for r in jobs.mark_deleted(
                session=session, document_id=summit.document_id, actor="test"
            )
        )

    report = reconcile(ctx)

    by_doc = {f.document_id: f for f in report.findings}
    assert by_doc[river.document_id].orphan_ids == [beyond]
    assert by_doc[river.document_id].orphan_sources == {
        f"beyond the {river.chunk_count} chunks of job {river.id}": 1
    }
    assert by_doc[summit.document_id].orphans == summit.chunk_count
    assert list(by_doc[summit.document_id].orphan_sources) == [
        f"of deleted document {summit.document_id}"
    ]

    reconcile(ctx, repair=True, actor="test")
    assert reconcile(ctx).clean
    assert coll.count() == river.chunk_count


def test_missing_chunks_of_an_older_pipeline_version_get_a_job_of_the_current_one(make_ctx):
    ctx = make_ctx()
    old = indexed(ctx, ["delta"])["delta"]
    coll = ctx.vectors.collection(collection(ctx))
    coll.delete(ids=ids_of_job(ctx, old.id)[:1])
    new_ctx = make_ctx(SLUICE_CHUNK_SIZE="400")

    report = reconcile(new_ctx, repair=True, actor="test")

    [queued] = report.queued
    assert queued != old.id and job(new_ctx, queued).pipeline_version == new_ctx.pipeline_version
    assert job(new_ctx, old.id).status == JobStatus.succeeded  # still serves search meanwhile
    assert reconcile(new_ctx, repair=True, actor="test").queued == []  # no second job
    assert run_job(queued, ctx=new_ctx).result == "succeeded"
    assert job(new_ctx, old.id).status == JobStatus.superseded
    assert ids_of_job(new_ctx, old.id) == []
    assert reconcile(new_ctx).clean


def test_cli_reconcile_json_and_exit_codes(ctx, capsys):
    indexed(ctx, ["tundra"])
    ctx.vectors.collection(collection(ctx)).add(
        ids=["x-1"],
        embeddings=np.full((1, 384), 0.2, dtype=np.float32),
        documents=["x"],
        metadatas=[{"a": 1}],
    )

    assert cli(["reconcile", "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["orphans"] == 1 and out["repair_plan"]["delete_orphans"] == 1 and not out["clean"]

    assert cli(["reconcile", "--repair"]) == 0
    assert "x-1" in capsys.readouterr().out
    assert cli(["reconcile"]) == 0
    assert "clean" in capsys.readouterr().out


def test_periodic_reconcile_signature_repairs(ctx):
    from sluice.pipeline.running.context import get_context

    indexed(ctx, ["steppe"])
    ctx.vectors.collection(collection(ctx)).add(
        ids=["y-1"],
        embeddings=np.full((1, 384), 0.3, dtype=np.float32),
        documents=["y"],
        metadatas=[{"b": 2}],
    )
    report = reconcile(get_context(), repair=True, actor="periodic reconcile")
    assert report.orphans == 1 and reconcile(ctx).clean


@pytest.mark.slow
def test_crash_leftovers_of_a_job_the_reaper_cancels_are_removed_by_it(ctx, start_worker):
    """A worker is killed mid-embedding, the operator cancels the stalled job, the reaper ends it:
    the reaper removes what the dead worker wrote, as the worker would have (issue 25, race 9);
    before, nobody did until a reconcile."""
    from sluice.pipeline.queueing import recovery
    from sluice.pipeline.queueing.publishing import publish

    victim = start_worker(
        env={"SLUICE_FAULTS": "embed_batch@3=exit", "SLUICE_EMBED_BATCH_SIZE": "4"}, name="victim"
    )
    r = ingest_bytes(
        ctx, text("estuary", 30), dataset="default", filename="estuary.txt", publish=publish
    )
    deadline = time.monotonic() + 60
    while victim.alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not victim.alive()
    written = ids_of_job(ctx, r.job_id)
    assert len(written) == 12
    with Session(ctx.engine) as session:
        assert jobs.request_cancel(session=session, job_ids=[r.job_id], actor="test")[0].ok
    deadline = time.monotonic() + 60
    while job(ctx, r.job_id).status == JobStatus.running and time.monotonic() < deadline:
        recovery.run_once(ctx, publish=publish)  # the reaper finds the heartbeat stale
        time.sleep(0.5)
    [j] = wait_for(ctx, [r.job_id], timeout=10)
    assert j.status == JobStatus.cancelled and ids_of_job(ctx, r.job_id) == []
    assert reconcile(ctx).clean


# --- a large store --------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_reconcile_walks_200000_chunks_in_memory_bounded_by_its_page(ctx, capsys):
    """200,000 chunks walked in pages of 5,000 (the default): the traced peak is about one page's
    worth (some 15 MB), as it was at 20,000, while loading every id with its metadata at once would
    take about 450 MB. ``make bench`` reports the time of the same walk (bench/reconcile_scale.py);
    the time is not asserted here."""
    documents, chunks_each = 200, 1000
    name, _ = synthetic_store(ctx, documents=documents, chunks_each=chunks_each)
    coll = ctx.vectors.collection(name)
    assert coll.count() == documents * chunks_each
    add_problems(ctx, name)  # a few problems among them, so the audit has something to find

    walk = traced_reconcile(ctx, "big")

    report = walk.report
    [summary] = report.datasets
    total = documents * chunks_each
    assert summary.chunks == total - MISSING + ALIENS and summary.expected == total
    assert summary.pages == 40  # walked page by page, not in one request
    assert (report.missing, report.orphans, report.mismatched) == (MISSING, ALIENS, 0)
    # The bound of one page: the same as for a tenth of this store. Loading all ids with their
    # metadata would take about 450 MB in Python objects.
    assert walk.peak < 24 * 1024 * 1024, f"peak {walk.peak / 1e6:.1f} MB"
    with capsys.disabled():
        print(
            f"\nreconcile of {summary.chunks:,} chunks in {summary.pages} pages: "
            f"{walk.seconds:.1f} s traced, peak traced memory {walk.peak / 1e6:.1f} MB"
        )
    ctx.vectors.drop_collection(name)


# --- the console panel ----------------------------------------------------------------------------


def test_console_integrity_panel_reports_previews_repairs_deletes_and_reindexes(make_ctx):
    import streamlit as st

    from tests.support.apptest import assert_ok, metric, open_console, texts

    st.cache_resource.clear()  # the panel's background runner is per process
    ctx = make_ctx()
    done = indexed(ctx, ["harbour", "orchard"])
    ctx.vectors.collection(collection(ctx)).add(
        ids=["stray-1"],
        embeddings=np.full((1, 384), 0.2, dtype=np.float32),
        documents=["x"],
        metadatas=[{"a": 1}],
    )

    def settle(at, until):
        deadline = time.monotonic() + 30
        while not until(at) and time.monotonic() < deadline:
            time.sleep(0.1)
            at.run()
        assert_ok(at)
        assert until(at), texts(at)

    at = open_console("integrity")
    assert "No reconcile has run on this machine yet" in texts(at)
    at.button(key="reconcile_check").click().run()
    settle(at, lambda a: any(m.label == "Orphans" for m in a.metric))
    assert metric(at, "Orphans") == "1" and metric(at, "Missing") == "0"
    assert "Repair checks again, then deletes **1** orphan chunk(s)" in texts(at)

    at.button(key="reconcile_repair").click().run()
    at.button(key="reconcile_repair:yes").click().run()
    settle(at, lambda a: "What repair did" in "".join(e.label for e in a.expander))
    assert ctx.vectors.collection(collection(ctx)).get(ids=["stray-1"])["ids"] == []
    at.button(key="reconcile_check").click().run()
    settle(at, lambda a: "Clean: the index holds exactly" in texts(a))

    harbour = done["harbour"]
    at.text_input(key="delete_ref").input(str(harbour.id)).run()
    assert "harbour.txt" in texts(at) and "removes the file too" in texts(at)
    at.button(key=f"delete_doc:{harbour.document_id}").click().run()
    at.button(key=f"delete_doc:{harbour.document_id}:yes").click().run()
    assert_ok(at)
    assert "deleted document" in texts(at) and job(ctx, harbour.id).status == JobStatus.deleted

    make_ctx(SLUICE_CHUNK_SIZE="400")
    at.toggle(key="reindex_preview").set_value(True).run()
    assert_ok(at)
    assert (
        metric(at, "Documents to rebuild") == "1" and metric(at, "From the embedding cache") == "0"
    )
    at.button(key="reindex_all").click().run()
    at.button(key="reindex_all:yes").click().run()
    assert_ok(at)
    assert "1 job(s) queued for pipeline" in texts(at)
