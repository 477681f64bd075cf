"""Pipeline versions: reindex --all builds the new version beside the old one and switches search
per document when its new job succeeds; searches during the switch see exactly one version of each
document and never lose one; previews count documents, chunks and cache hits."""

import json
import threading
import time
from collections import defaultdict

from sqlmodel import Session, select

from sluice.cli.main import main as cli
from sluice.ops import reindex
from sluice.ops.ingest import ingest_bytes
from sluice.ops.preview import preview_jobs
from sluice.ops.search import search
from sluice.pipeline.reconcile.audit import reconcile
from sluice.pipeline.running.runner import run_job
from sluice.storage.models import Document, Job, JobStatus
from tests.support.helpers import Background, collection, ids_of_job, job, wait_for
from tests.test_reconcile import indexed, text

TOPICS = ["harbour", "orchard", "glacier", "volcano", "prairie"]


def active_jobs(ctx) -> dict[int, Job]:
    with Session(ctx.engine) as session:
        docs = session.exec(select(Document)).all()
        return {d.id: session.get(Job, d.active_job_id) for d in docs}


class Searcher(Background):
    """Searches every topic in a loop and records anything the switch must never show."""

    def __init__(self, ctx, doc_of_topic):
        super().__init__(name="searcher")
        self.ctx, self.doc_of_topic = ctx, doc_of_topic
        self.stop = threading.Event()
        self.searches = 0
        self.problems: list[str] = []
        self.versions_seen: dict[int, set[str]] = defaultdict(set)

    def work(self):
        while not self.stop.is_set():
            for topic, doc_id in self.doc_of_topic.items():
                hits = search(self.ctx, query=f"{topic} {topic}", dataset="default", k=8)
                self.searches += 1
                versions = defaultdict(set)
                for h in hits:
                    versions[h.document_id].add(h.pipeline_version)
                if not hits:
                    self.problems.append(f"search for {topic} returned nothing")
                elif doc_id not in versions:
                    self.problems.append(
                        f"search for {topic} lost its document: {[h.filename for h in hits]}"
                    )
                for d, vs in versions.items():
                    if len(vs) != 1:
                        self.problems.append(f"document {d} answered in versions {sorted(vs)}")
                    self.versions_seen[d] |= vs


def test_reindex_all_switches_each_document_once_while_searches_run(make_ctx, start_worker):
    from sluice.pipeline.queueing.publishing import publish

    old_ctx = make_ctx()
    old = indexed(old_ctx, TOPICS)
    old_total = sum(j.chunk_count for j in old.values())
    ctx = make_ctx(SLUICE_CHUNK_SIZE="400", SLUICE_CHUNK_OVERLAP="50", SLUICE_EMBED_BATCH_SIZE="4")
    assert ctx.pipeline_version != old_ctx.pipeline_version

    plan = reindex.plan(ctx)
    assert (plan.documents, plan.underway, plan.old_chunks) == (5, 0, old_total)
    assert not plan.preview.estimated and plan.preview.sampled == 5
    assert (
        plan.preview.chunks > old_total and plan.preview.cached == 0
    )  # a new version: a cold cache
    assert plan.preview.to_embed == plan.preview.chunks
    assert {c.action for c in plan.candidates} == {"create"}

    searcher = Searcher(ctx, {t: j.document_id for t, j in old.items()})
    searcher.start()
    # Slow batches, so that the switch takes a while and the searches overlap it.
    start_worker(env={"SLUICE_FAULTS": "embed_batch=sleep:0.1"}, workers=2)
    result = reindex.reindex_all(ctx, actor="test", publish=publish)
    assert result.queued == 5 and result.queue_error is None
    new_ids = [r.job_id for r in result.results]
    done = wait_for(ctx, new_ids, timeout=120)
    searcher.check()
    before_stop = searcher.searches
    deadline = time.monotonic() + 60
    while searcher.searches < before_stop + len(TOPICS) * 3:  # a few rounds after the last switch
        assert searcher.is_alive(), "the searching thread died (its exception is reported below)"
        searcher.join(0.05)
        searcher.check()  # a searcher that died makes no more rounds: fail now, do not wait
        assert time.monotonic() < deadline, f"searches stalled at {searcher.searches}"
    searcher.stop.set()
    searcher.result(30)

    assert searcher.problems == [], searcher.problems[:5]
    both = [
        d
        for d, vs in searcher.versions_seen.items()
        if vs == {old_ctx.pipeline_version, ctx.pipeline_version}
    ]
    assert both, "no search saw a document before and after its switch"
    assert all(
        j.status == JobStatus.succeeded and j.pipeline_version == ctx.pipeline_version for j in done
    )
    assert {j.id for j in active_jobs(ctx).values()} == set(new_ids)
    assert all(job(ctx, j.id).status == JobStatus.superseded for j in old.values())
    # Only the new version's chunks remain.
    held = ctx.vectors.ids_where(collection(ctx), {"pipeline_version": old_ctx.pipeline_version})
    assert held == []
    assert (
        ctx.vectors.count(collection(ctx))
        == sum(j.chunk_count for j in done)
        == plan.preview.chunks
    )
    assert reconcile(ctx).clean
    # Nothing left to do; a second run queues nothing.
    assert reindex.plan(ctx).documents == 0 and reindex.reindex_all(ctx, actor="test").queued == 0


def test_a_failed_new_version_keeps_the_old_one_searchable_and_is_retried(make_ctx, monkeypatch):
    old_ctx = make_ctx()
    old = indexed(old_ctx, ["orchard"])["orchard"]
    ctx = make_ctx(SLUICE_CHUNK_SIZE="400")
    [queued] = reindex.reindex_all(ctx, actor="test").results
    monkeypatch.setenv("SLUICE_FAULTS", "after_parse=permanent")
    assert run_job(queued.job_id, ctx=ctx).result == "failed"
    monkeypatch.delenv("SLUICE_FAULTS")

    hits = search(ctx, query="orchard", dataset="default", k=3)
    assert hits and {h.job_id for h in hits} == {old.id}
    assert reconcile(ctx).clean  # the failed attempt wrote nothing
    [c] = reindex.plan(ctx).candidates
    assert (c.action, c.target_job_id) == ("retry", queued.job_id)

    again = reindex.reindex_all(ctx, actor="test")
    assert [r.job_id for r in again.results] == [queued.job_id] and again.queued == 1
    assert run_job(queued.job_id, ctx=ctx).result == "succeeded"
    assert {h.job_id for h in search(ctx, query="orchard", dataset="default", k=3)} == {
        queued.job_id
    }


def test_going_back_to_the_old_settings_revives_the_old_version_from_the_cache(
    database_url, make_ctx
):
    first = make_ctx()
    v1 = indexed(first, ["glacier"])["glacier"]
    second = make_ctx(SLUICE_CHUNK_SIZE="400")
    [r] = reindex.reindex_all(second, actor="test").results
    assert run_job(r.job_id, ctx=second).result == "succeeded"
    assert job(second, v1.id).status == JobStatus.superseded

    back = make_ctx(SLUICE_CHUNK_SIZE="800")
    assert back.pipeline_version == v1.pipeline_version
    plan = reindex.plan(back)
    assert [(c.action, c.target_job_id) for c in plan.candidates] == [("revive", v1.id)]
    assert (
        plan.preview.chunks == v1.chunk_count and plan.preview.cached == v1.chunk_count
    )  # all cached
    assert plan.preview.cache_hit_rate == 1.0 and plan.preview.to_embed == 0

    assert reindex.reindex_all(back, actor="test").queued == 1
    assert run_job(v1.id, ctx=back).result == "succeeded"
    revived = job(back, v1.id)
    assert revived.embedded_count == 0 and revived.cached_count == v1.chunk_count
    assert job(back, r.job_id).status == JobStatus.superseded
    assert ids_of_job(back, r.job_id) == [] and reconcile(back).clean


def test_dataset_scope_and_cli(make_ctx, capsys):
    old_ctx = make_ctx()
    indexed(old_ctx, ["volcano"])
    indexed(old_ctx, ["prairie"], dataset="other")
    make_ctx(SLUICE_CHUNK_SIZE="400")

    assert cli(["reindex", "--all", "--dataset", "other", "--dry-run", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["documents"] == 1 and [c["dataset"] for c in out["candidates"]] == ["other"]
    assert out["preview"]["to_embed"] > 0

    assert cli(["reindex", "--all", "--dataset", "other"]) == 0
    assert capsys.readouterr().out.startswith("1 job(s) queued")
    assert cli(["reindex", "--all", "--dry-run"]) == 0
    assert (
        "1 document(s) to rebuild" in (text_out := capsys.readouterr().out)
        and "1 more already under way" in text_out
    )


def test_retry_preview_counts_index_cache_and_work(make_ctx, monkeypatch, capsys, services):
    ctx = make_ctx(SLUICE_EMBED_BATCH_SIZE="4")
    total = indexed(ctx, ["lagoon"], dataset="elsewhere")[
        "lagoon"
    ].chunk_count  # the same text, run cleanly
    assert total > 4
    services.cache.client().flushdb()
    monkeypatch.setenv("SLUICE_FAULTS", "embed_batch=permanent")
    r = ingest_bytes(ctx, text("lagoon"), dataset="default", filename="lagoon.txt")
    assert run_job(r.job_id, ctx=ctx).result == "failed"  # one batch of 4 written, and cached
    monkeypatch.delenv("SLUICE_FAULTS")

    p = preview_jobs(ctx, [r.job_id, 424242])
    assert (p.jobs, p.chunks, p.in_index, p.cached, p.to_embed) == (1, total, 4, 0, total - 4)

    ctx.vectors.delete(
        collection(ctx), ids=ids_of_job(ctx, r.job_id)
    )  # the index lost them, the cache did not
    assert cli(["retry", "--dry-run", "--json", str(r.job_id)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["in_index"], out["cached"], out["to_embed"]) == (0, 4, total - 4)
    assert job(ctx, r.job_id).status == JobStatus.failed  # a dry run changes nothing


def test_the_preview_extrapolates_a_sample_by_the_size_of_the_documents(make_ctx):
    old_ctx = make_ctx()
    for n, topic in enumerate(TOPICS, start=1):
        r = ingest_bytes(
            old_ctx, text(topic, paragraphs=3 * n), dataset="default", filename=f"{topic}.txt"
        )
        assert run_job(r.job_id, ctx=old_ctx).result == "succeeded"
    ctx = make_ctx(SLUICE_CHUNK_SIZE="400")

    exact = reindex.plan(ctx, sample=100).preview
    guess = reindex.plan(ctx, sample=2).preview

    assert not exact.estimated and exact.sampled == 5
    assert guess.estimated and guess.sampled == 2 and guess.jobs == 5
    assert (
        abs(guess.chunks - exact.chunks) <= 0.2 * exact.chunks
    )  # the two smallest stand for all five
    assert "estimated from 2 parsed document(s)" in reindex.plan(ctx, sample=2).describe()
