"""Search while the index changes under it.

Chroma answers a query in two steps: it finds ids in its vector index, then reads their records. A
delete landing between the two (a superseded version being removed, a cancel, a delete) leaves an id
whose metadata and text are None. Search must leave such a chunk out, not fail on it: the console
searches while a reindex removes old versions.
"""

import time

import numpy as np

from sluice.ops.search import search
from tests.support.helpers import Background, collection
from tests.test_reconcile import indexed


class Churn(Background):
    """Adds and deletes chunks of a job that is not active, in the collection search reads, until
    told."""

    def __init__(self, ctx, name: str) -> None:
        super().__init__(name="churn")
        self.ctx, self.coll, self.stop = ctx, name, False
        self.rounds = 0

    def work(self):
        rng = np.random.default_rng(7)
        coll = self.ctx.vectors.collection(self.coll)
        while not self.stop:
            ids = [f"churn-{self.rounds}-{i}" for i in range(40)]
            coll.add(
                ids=ids,
                embeddings=rng.normal(size=(40, self.ctx.embedder.dim)).astype("float32"),
                documents=["gone soon"] * 40,
                metadatas=[{"job_id": 10**9, "document_id": 10**9}] * 40,
            )
            coll.delete(ids=ids)
            self.rounds += 1


def test_search_leaves_out_chunks_deleted_while_it_queries(make_ctx):
    ctx = make_ctx()
    done = indexed(ctx, ["harbour", "orchard", "glacier"])
    active_jobs = {j.id for j in done.values()}
    churn = Churn(ctx, collection(ctx))
    churn.start()
    deadline = time.monotonic() + 90
    searches = 0
    try:
        # Until Chroma has answered at least once with a deleted record (the window this is about).
        while ctx.vectors.vanished_hits == 0:
            assert time.monotonic() < deadline, (
                f"no query met a concurrent delete in {searches} searches"
            )
            churn.check()
            hits = search(ctx, query="harbour ships", dataset="default", k=20, mode="dense")
            searches += 1
            assert hits and {h.job_id for h in hits} <= active_jobs
    finally:
        churn.stop = True
    churn.result(timeout=60)
    assert churn.rounds > 0


def test_a_search_of_every_dataset_encodes_the_query_once(make_ctx):
    from sluice.ops import reads
    from sluice.pipeline.running.embed import HashEmbedder

    class Counting(HashEmbedder):
        calls = 0

        def encode(self, texts):
            Counting.calls += len(texts)
            return super().encode(texts)

    ctx = make_ctx(embedder=Counting())
    for name in ("alpha", "beta", "gamma"):
        indexed(ctx, [f"{name}-harbour"], dataset=name)
    Counting.calls = 0
    hits = reads.search("harbour section", None, 60, mode="dense")
    assert {h.filename for h in hits} == {
        "alpha-harbour.txt",
        "beta-harbour.txt",
        "gamma-harbour.txt",
    }
    assert Counting.calls == 1
