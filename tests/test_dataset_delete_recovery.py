"""A dataset delete that died halfway is finished by the workers' periodic recovery round, not only
by a rerun, the console or ``sluice recover``; and a delete leaves none of its switched-off chunks
behind (sluice.pipeline.running.dataset_deletion)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import update
from sqlmodel import Session, select

from sluice import faults
from sluice.ops import dataset_admin
from sluice.ops.access import LOCAL_OPERATOR
from sluice.ops.chunks import set_chunk_enabled
from sluice.pipeline.queueing import recovery
from sluice.pipeline.reconcile.audit import reconcile
from sluice.pipeline.running import dataset_deletion
from sluice.storage import lexical
from sluice.storage.clock import db_now
from sluice.storage.models import Dataset, DisabledChunk, Document
from tests.test_dataset_admin import ALPHA, BETA, assert_gone, dataset_row, indexed


class Killed(BaseException):
    """The deleting process ends here (kill -9): nothing in the delete handles it."""


def killed(**_) -> None:
    raise Killed()


def a_while_ago(ctx, name: str) -> None:
    """The mark of the delete is older than a delete that still runs can be."""
    with Session(ctx.engine) as session:
        then = db_now(session) - timedelta(seconds=dataset_deletion.STALE_SECONDS + 1)
        session.execute(update(Dataset).where(Dataset.name == name).values(deleting_at=then))
        session.commit()


def test_a_delete_killed_halfway_is_finished_by_the_periodic_recovery(ctx, monkeypatch):
    monkeypatch.setattr(recovery, "_sleep", lambda _s: None)
    indexed(ctx, ALPHA, "alpha", "albatross.txt")
    indexed(ctx, BETA, "alpha", "bees.txt")
    kept = indexed(ctx, BETA, "beta", "bees.txt")  # another dataset, the same bytes
    ds = dataset_row(ctx, "alpha")
    with Session(ctx.engine) as session:
        blob = session.exec(select(Document).where(Document.dataset_id == ds.id)).first().blob_key
        shared = session.get(Document, kept.document_id).blob_key
    with faults.hook("dataset_delete_document", killed):  # after its first document went
        with pytest.raises(Killed):
            dataset_admin.delete(ctx, LOCAL_OPERATOR, "alpha")
    assert dataset_row(ctx, "alpha").deleting_at is not None

    # a delete marked a moment ago may still be running: a round leaves it to its process
    assert recovery.run_once(ctx, publish=lambda _id: None).datasets_deleted == []
    assert dataset_row(ctx, "alpha") is not None

    a_while_ago(ctx, "alpha")
    report = recovery.run_once(ctx, publish=lambda _id: None)
    assert report.datasets_deleted and "'alpha' deleted" in report.datasets_deleted[0], report
    assert_gone(ctx, "alpha", ds.id, ds.collection, blob)
    assert ctx.blobs.exists(shared)  # beta's bees.txt still uses it
    assert dataset_row(ctx, "beta") is not None
    assert recovery.run_once(ctx, publish=lambda _id: None).datasets_deleted == []
    assert reconcile(ctx).clean


def test_a_round_whose_delete_finds_chroma_down_leaves_the_mark_for_the_next(ctx, monkeypatch):
    monkeypatch.setattr(recovery, "_sleep", lambda _s: None)
    indexed(ctx, ALPHA, "alpha", "albatross.txt")
    with faults.hook("dataset_delete_marked", killed):
        with pytest.raises(Killed):
            dataset_admin.delete(ctx, LOCAL_OPERATOR, "alpha")
    a_while_ago(ctx, "alpha")

    def chroma_down(**_):
        raise ConnectionError("chroma went away")

    with faults.hook("dataset_delete_documents_removed", chroma_down):
        report = recovery.run_once(ctx, publish=lambda _id: None)
    assert report.datasets_deleted == [] and report.publish_error is None
    assert dataset_row(ctx, "alpha").deleting_at is not None
    assert recovery.run_once(ctx, publish=lambda _id: None).datasets_deleted
    assert dataset_row(ctx, "alpha") is None


def test_a_delete_removes_the_switched_off_chunks_of_the_dataset(ctx):
    a = indexed(ctx, ALPHA, "alpha", "albatross.txt")
    b = indexed(ctx, BETA, "beta", "bees.txt")
    off_a = lexical.job_chunks(ctx.engine, a.job_id, limit=1)[0].chunk_id
    off_b = lexical.job_chunks(ctx.engine, b.job_id, limit=1)[0].chunk_id
    set_chunk_enabled(ctx, off_a, False, actor="op")
    set_chunk_enabled(ctx, off_b, False, actor="op")
    alpha = dataset_row(ctx, "alpha").id
    assert dataset_admin.delete(ctx, LOCAL_OPERATOR, "alpha").ok
    with Session(ctx.engine) as session:
        left = session.exec(select(DisabledChunk)).all()
    assert [(r.dataset_id, r.chunk_id) for r in left] == [(dataset_row(ctx, "beta").id, off_b)]
    assert alpha not in {r.dataset_id for r in left}
