"""What the vector index can return (chroma-core/chroma#7758): ids deleted and added again until
a chunk is not returned for its own vector; the audit reports it (reconcile, its report) and the
repair rebuilds the collection beside the old one, switches and drops it, and the chunk is found
again. Real Chroma server (the session's)."""

from __future__ import annotations

import numpy as np
import pytest

from sluice.pipeline.reconcile import recall
from sluice.pipeline.reconcile.audit import reconcile
from sluice.storage.vectors import chunk_id
from tests.support.apptest import open_console, texts
from tests.support.helpers import collection, make_job

pytestmark = [pytest.mark.servers, pytest.mark.slow]

N, DIM = 4000, 384


def _clustered(rng: np.random.Generator) -> np.ndarray:
    """Vectors in twenty tight groups, as a corpus's embeddings are (random ones never collide)."""
    centers = rng.normal(size=(20, DIM))
    v = centers[rng.integers(0, 20, N)] + 0.35 * rng.normal(size=(N, DIM))
    return (v / np.linalg.norm(v, axis=1, keepdims=True)).astype(np.float32)


def _add(ctx, name: str, ids: list[str], vectors: np.ndarray, rows) -> None:
    for start in range(0, len(rows), 1000):
        part = rows[start : start + 1000]
        ctx.vectors.add(
            name,
            ids=[ids[i] for i in part],
            embeddings=vectors[part],
            documents=[f"chunk {i}" for i in part],
            metadatas=[{"position": int(i)} for i in part],
        )


def test_a_chunk_its_own_vector_does_not_find_is_reported_and_the_rebuild_restores_it(ctx):
    job = make_job(ctx.engine, "default", 7758)  # pending: reconcile leaves its chunks alone
    name = collection(ctx)
    # A collection as Sluice made them before: Chroma's default graph settings.
    ctx.vectors.client.get_or_create_collection(
        name, embedding_function=None, metadata={"hnsw:space": "cosine"}
    )
    rng = np.random.default_rng(7758)
    vectors = _clustered(rng)
    ids = [chunk_id(f"{7758:064x}", "v1", i) for i in range(N)]
    _add(ctx, name, ids, vectors, np.arange(N))
    found = None
    for _ in range(8):  # a cancel and its retry: the same ids deleted and added again
        again = np.sort(rng.choice(N, size=N // 2, replace=False))
        ctx.vectors.delete(name, ids=[ids[i] for i in again])
        _add(ctx, name, ids, vectors, again)
        found = recall.audit_recall(ctx, name, sample=N, queries=0)
        if found.unreachable:
            break
    assert found is not None and found.unreachable, "no chunk became unreachable"
    lost = found.unreachable_ids[0]
    own = vectors[ids.index(lost)]
    assert lost not in [h.id for h in ctx.vectors.query(name, own, n=10)]
    assert ctx.vectors.get(name, [lost])["ids"] == [lost]  # get() still returns it

    dry = reconcile(ctx, index_sample=N)
    [summary] = dry.datasets
    assert summary.index_unhealthy and summary.index["unreachable"] >= 1
    assert dry.index_problems == 1 and not dry.clean
    assert "unreachable" in dry.describe() and dry.repair_plan()["rebuild_collections"] == 1
    assert dry.to_dict()["datasets"][0]["index"]["healthy"] is False
    assert _metric("sluice_index_unreachable_chunks") >= 1
    page = texts(open_console("integrity"))  # the report the check saved, as the console shows it
    assert "unreachable" in page and "Clean" not in page and "rebuilds the vector index" in page

    fixed = reconcile(ctx, repair=True, index_sample=N)
    new = collection(ctx)
    assert new != name and any("rebuilt the vector index" in a for a in fixed.actions)
    assert fixed.datasets[0].index["unreachable"] == 0 and not fixed.datasets[0].index_unhealthy
    assert ctx.vectors.count(new) == N and job.id
    assert ctx.vectors.query(new, own, n=1)[0].id == lost
    assert name not in [c.name for c in ctx.vectors.client.list_collections()]
    assert reconcile(ctx, index_sample=N).index_problems == 0
    assert (
        _metric("sluice_index_unreachable_chunks") == 0
        and _metric("sluice_index_recall") >= recall.RECALL_THRESHOLD
    )


def _metric(name: str) -> float:
    """The default dataset's value of ``name`` in a scrape of the metrics registry."""
    from prometheus_client import generate_latest

    from sluice.ops.metrics import registry

    for line in generate_latest(registry()).decode().splitlines():
        if line.startswith(f'{name}{{dataset="default"}} '):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in the scrape")


class ShallowMiss:
    """The session's store, whose answers shorter than the second of ``recall.DEEP`` (or than the
    collection) leave out ``hidden``: a chunk the 10 nearest and the first deeper walk miss, as 1
    in 1,000 sampled at 300,000 chunks (found at 3,000)."""

    def __init__(self, store, hidden: str) -> None:
        self.store, self.hidden, self.deep = store, hidden, 0

    def query_ids(self, name, embeddings, *, n):
        rows = self.store.query_ids(name, embeddings, n=n)
        if n >= recall.DEEP[1] or n >= self.store.count(name):
            self.deep += 1
            return rows
        return [[hit for hit in row if hit[0] != self.hidden] for row in rows]

    def __getattr__(self, name):
        return getattr(self.store, name)


@pytest.mark.parametrize("graph", ["as_built_now", "chroma_defaults"])
def test_a_chunk_only_a_deep_walk_finds_is_hard_to_reach_and_rebuilt_only_for_a_weaker_graph(
    ctx, graph
):
    """A graph as good as a rebuild would make is not rebuilt for a chunk a shallow walk misses (a
    rebuild copied 300,000 chunks for one such and made the same kind of graph); one built with
    Chroma's defaults is. A chunk not found even deep stays unreachable (the test above)."""
    make_job(ctx.engine, "default", 7759)
    name = collection(ctx)
    if graph == "chroma_defaults":
        ctx.vectors.client.get_or_create_collection(
            name, embedding_function=None, metadata={"hnsw:space": "cosine"}
        )
    rng = np.random.default_rng(7759)
    vectors = _clustered(rng)[:1500]
    ids = [chunk_id(f"{7759:064x}", "v1", i) for i in range(len(vectors))]
    _add(ctx, name, ids, vectors, np.arange(len(vectors)))
    store = ctx.vectors
    shallow = ctx.__dict__["vectors"] = ShallowMiss(store, ids[42])
    try:
        found = recall.audit_recall(ctx, name, sample=len(ids), queries=0)
        assert (found.unreachable, found.hard_to_reach, shallow.deep) == (0, 1, 1)
        assert "1 found only by a deeper walk" in found.describe()
        fixed = reconcile(ctx, repair=True, index_sample=len(ids))
    finally:
        ctx.__dict__["vectors"] = store
    rebuilt = any("rebuilt the vector index" in a for a in fixed.actions)
    if graph == "as_built_now":
        assert found.healthy and not found.weaker_graph and "would not help" in found.describe()
        assert not rebuilt and collection(ctx) == name and not fixed.datasets[0].index_unhealthy
    else:
        assert not found.healthy and found.weaker_graph and "a rebuild makes" in found.describe()
        assert rebuilt and collection(ctx) != name


class StaleCount:
    """The session's store, whose count is the one taken before a job wrote its chunks."""

    def __init__(self, store) -> None:
        self.store = store

    def count(self, name):
        return 0

    def __getattr__(self, name):
        return getattr(self.store, name)


def test_chunks_written_after_the_audit_counted_are_sampled_not_a_crash(ctx):
    """A repair beside running jobs counted an empty collection, then listed the chunks a job had
    written since: the deeper walk divided by the stale count of 0 (a reconcile error in CI)."""
    make_job(ctx.engine, "default", 7760)
    name = collection(ctx)
    vectors = _clustered(np.random.default_rng(7760))[:50]
    ids = [chunk_id(f"{7760:064x}", "v1", i) for i in range(len(vectors))]
    _add(ctx, name, ids, vectors, np.arange(len(vectors)))
    store = ctx.vectors
    ctx.__dict__["vectors"] = StaleCount(store)
    try:
        found = recall.audit_recall(ctx, name, sample=100, queries=0)
    finally:
        ctx.__dict__["vectors"] = store
    assert (found.chunks, found.sampled, found.unreachable) == (50, 50, 0)
    assert found.healthy
