"""A cancel and its retry never delete an id and add it again (chroma-core/chroma#7758: after
deletes and re-adds of the same ids, Chroma's query() can stop returning live records). The cancel
keeps what the attempt wrote (search serves only a document's active, succeeded job), the retry
writes only what is not there and removes only what it will not write, and the document is found
by its own vectors afterwards. Real Chroma server (the session's), the worker's code in-process so
that a spy sees every write."""

from __future__ import annotations

import numpy as np
import pytest

from sluice import faults
from sluice.ops import actions
from sluice.ops.access import Operator
from sluice.ops.ingest import ingest_bytes
from sluice.ops.search import search
from sluice.pipeline.reconcile import recall
from sluice.pipeline.reconcile.audit import reconcile
from sluice.pipeline.running.runner import run_job
from tests.support.helpers import collection, ids_of_job, job

pytestmark = pytest.mark.servers

OPERATOR = Operator("olive", "operator", channel="console", address="10.0.0.7")
TEXT = "".join(
    f"Soundings off reef {n}: the channel holds {n * 3} fathoms at low water.\n\n" * 6
    for n in range(30)
).encode()


class Spy:
    """Every id the store was asked to delete and to write, in order."""

    def __init__(self, vectors) -> None:
        self.log: list[tuple[str, str]] = []  # (deleted | added | upserted, id)
        self.vectors = vectors
        delete, add = vectors.delete, vectors.add

        def spied_delete(name, *, ids=None, where=None):
            gone = list(ids) if ids is not None else vectors.ids_where(name, where or {})
            self.log += [("deleted", i) for i in gone]
            return delete(name, ids=ids, where=where)

        def spied_add(name, *, ids, **rest):
            self.log += [("added", i) for i in ids]
            return add(name, ids=ids, **rest)

        vectors.delete, vectors.add = spied_delete, spied_add
        if hasattr(vectors, "upsert"):
            upsert = vectors.upsert

            def spied_upsert(name, *, ids, **rest):
                self.log += [("upserted", i) for i in ids]
                return upsert(name, ids=ids, **rest)

            vectors.upsert = spied_upsert

    def deleted_then_written(self) -> list[str]:
        gone: set[str] = set()
        again = []
        for op, cid in self.log:
            if op == "deleted":
                gone.add(cid)
            elif cid in gone:
                again.append(cid)
        return again


def test_a_cancel_and_its_retry_never_delete_an_id_and_add_it_again(make_ctx, monkeypatch):
    ctx = make_ctx(SLUICE_EMBED_BATCH_SIZE="4")
    # every progress write reads the cancel: the attempt sees it at the batch after the request
    monkeypatch.setattr("sluice.pipeline.running.runner.PROGRESS_EVERY_SECONDS", 0)
    spy = Spy(ctx.vectors)
    r = ingest_bytes(ctx, TEXT, dataset="default", filename="reef.txt")
    batches: list[int] = []

    def cancel_after_two_batches(**_) -> None:
        batches.append(1)
        if len(batches) == 2:
            assert actions.cancel(OPERATOR, [r.job_id]).all_ok

    with faults.hook("embed_batch", cancel_after_two_batches):
        assert run_job(r.job_id, ctx=ctx).result == "cancelled"
    first = [cid for op, cid in spy.log if op == "added"]
    assert len(first) >= 8, first  # at least the two batches before the cancel was seen
    written = ids_of_job(ctx, r.job_id)
    hits = search(ctx, query="Soundings off reef", dataset="default", k=10, mode="dense")
    assert not [h for h in hits if h.document_id == r.document_id]

    assert actions.retry(OPERATOR, [r.job_id]).all_ok
    assert run_job(r.job_id, ctx=ctx).result == "succeeded"

    assert spy.deleted_then_written() == []  # before: all of ``first``, deleted on the cancel
    assert sorted(written) == sorted(first)  # the cancel kept them
    done = job(ctx, r.job_id)
    ids = ids_of_job(ctx, r.job_id)
    assert done.chunk_count and len(ids) == done.chunk_count > len(written)
    assert set(written) <= set(ids)
    name = collection(ctx)
    got = ctx.vectors.get(name, ids, include=["embeddings"])
    for cid, vector in zip(got["ids"], got["embeddings"], strict=True):
        assert ctx.vectors.query(name, np.asarray(vector), n=1)[0].id == cid
    audit = recall.audit_recall(ctx, name, sample=len(ids), queries=0)
    assert not audit.unreachable
    hits = search(ctx, query="Soundings off reef 7", dataset="default", k=5, mode="dense")
    assert hits and hits[0].document_id == r.document_id
    assert reconcile(ctx).clean
