"""Deleting a document: vectors gone, blob gone unless another document shares the bytes, jobs
marked deleted with their history kept; a running job stops; the same bytes can be uploaded
again."""

import time

import pytest
from sqlmodel import Session

from sluice.cli.main import main as cli
from sluice.ops.documents import delete_document, document_info, parse_reference
from sluice.ops.ingest import ingest_bytes
from sluice.ops.search import search
from sluice.pipeline.reconcile.audit import reconcile
from sluice.pipeline.running.runner import run_job
from sluice.storage.models import Document, JobStatus
from tests.support.helpers import Background, events, ids_of_job, job
from tests.support.helpers import collection as _collection

ALPHA = b"Albatross migration routes cross the southern ocean every winter season. " * 60
BETA = b"Beekeeping starts with a calm hive, a smoker and patient hands in spring. " * 60


def document(ctx, document_id):
    with Session(ctx.engine) as session:
        return session.get(Document, document_id)


def ingest_and_run(ctx, data, dataset, filename):
    r = ingest_bytes(ctx, data, dataset=dataset, filename=filename)
    assert run_job(r.job_id, ctx=ctx).result == "succeeded"
    return r


def test_delete_removes_vectors_and_keeps_a_shared_blob_until_its_last_document_goes(
    database_url, ctx, capsys
):
    a = ingest_and_run(ctx, ALPHA, "default", "alpha.txt")
    b = ingest_and_run(ctx, BETA, "default", "beta.txt")
    a2 = ingest_and_run(ctx, ALPHA, "other", "alpha-copy.txt")  # same bytes, another dataset
    blob = ctx.blobs.path(document(ctx, a.document_id).blob_key)
    preview = document_info(ctx, a.document_id)
    # what a delete reports is of its own dataset: the copy in "other" is not this key's to learn
    assert preview.blob_shared_with == 0 and preview.vectors == job(ctx, a.job_id).chunk_count > 0

    result = delete_document(ctx, f"doc:{a.document_id}", actor="test")

    assert result.ok and result.jobs_deleted == [a.job_id] and result.blob_removed
    assert result.vectors_removed == preview.vectors and "other document" not in result.message
    assert ids_of_job(ctx, a.job_id) == []
    assert len(ids_of_job(ctx, b.job_id)) == job(ctx, b.job_id).chunk_count
    assert len(ids_of_job(ctx, a2.job_id, "other")) == job(ctx, a2.job_id).chunk_count
    assert blob.exists()
    gone = job(ctx, a.job_id)
    assert gone.status == JobStatus.deleted and gone.chunk_count  # the row stays, with its numbers
    doc = document(ctx, a.document_id)
    assert doc.deleted_at is not None and doc.active_job_id is None
    kinds = [e.kind for e in events(ctx, a.job_id)]
    assert kinds[:3] == ["created", "claimed", "succeeded"] and kinds[-2:] == [
        "deleted",
        "vectors_removed",
    ]
    assert [e.actor for e in events(ctx, a.job_id)][-1] == "test"
    assert {
        h.filename for h in search(ctx, query="albatross migration", dataset="default", k=5)
    } == {"beta.txt"}
    assert {h.filename for h in search(ctx, query="albatross migration", dataset="other", k=5)} == {
        "alpha-copy.txt"
    }

    # The last document with these bytes goes, by its job id through the CLI: the blob goes too.
    assert cli(["delete", str(a2.job_id)]) == 0
    assert "blob removed" in capsys.readouterr().out
    assert not blob.exists()
    assert reconcile(ctx).clean

    # Deleting again is harmless and says so.
    again = delete_document(ctx, f"doc:{a.document_id}", actor="test")
    assert again.ok and again.jobs_deleted == [] and again.vectors_removed == 0


def test_the_same_bytes_can_be_uploaded_again_after_a_delete(ctx):
    a = ingest_and_run(ctx, ALPHA, "default", "alpha.txt")
    assert delete_document(ctx, a.job_id, actor="test").ok

    again = ingest_bytes(ctx, ALPHA, dataset="default", filename="alpha.txt")

    assert again.job_id == a.job_id and not again.duplicate  # the deleted job comes back
    assert run_job(a.job_id, ctx=ctx).result == "succeeded"
    assert document(ctx, a.document_id).deleted_at is None
    assert ctx.blobs.exists(document(ctx, a.document_id).blob_key)
    assert [h.filename for h in search(ctx, query="albatross", dataset="default", k=1)] == [
        "alpha.txt"
    ]
    assert "reuploaded" in [e.kind for e in events(ctx, a.job_id)]


def test_a_pending_job_of_a_deleted_document_never_runs(ctx):
    r = ingest_bytes(ctx, BETA, dataset="default", filename="beta.txt")
    assert delete_document(ctx, f"doc:{r.document_id}", actor="test").ok
    outcome = run_job(r.job_id, ctx=ctx)
    assert outcome.result == "noop" and "deleted" in outcome.message
    assert ids_of_job(ctx, r.job_id) == []


def test_deleting_a_document_while_its_job_runs_stops_the_job(database_url, make_ctx, monkeypatch):
    ctx = make_ctx(SLUICE_EMBED_BATCH_SIZE="4")
    monkeypatch.setenv("SLUICE_FAULTS", "embed_batch=sleep:0.3")
    r = ingest_bytes(ctx, ALPHA * 3, dataset="default", filename="alpha.txt")
    worker = Background(lambda: run_job(r.job_id, ctx=ctx), name="worker")
    worker.start()
    deadline = time.monotonic() + 30
    while len(ids_of_job(ctx, r.job_id)) < 8 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert job(ctx, r.job_id).status == JobStatus.running

    result = delete_document(ctx, r.job_id, actor="test")
    outcome = worker.result(30)

    assert result.ok and "were running" in result.message
    assert outcome.result == "lost"  # its next write found the job no longer its own
    assert job(ctx, r.job_id).status == JobStatus.deleted
    monkeypatch.delenv("SLUICE_FAULTS")
    # At most the batch in flight landed after the delete; reconcile removes it.
    reconcile(ctx, repair=True, actor="test")
    assert ids_of_job(ctx, r.job_id) == [] and reconcile(ctx).clean


def test_references_and_refusals(ctx, capsys):
    assert parse_reference("doc:42") == ("document", 42)
    assert parse_reference(" 17 ") == ("job", 17)
    assert not delete_document(ctx, "doc:x", actor="test").ok
    assert cli(["delete", "9999"]) == 1
    assert "no job 9999 (write doc:9999 for a document id)" in capsys.readouterr().err
    assert cli(["delete", "doc:9999"]) == 1


def _delete_report(ctx, other_holds_the_bytes: bool) -> tuple:
    a = ingest_and_run(ctx, ALPHA, "default", "alpha.txt")
    if other_holds_the_bytes:
        ingest_and_run(ctx, ALPHA, "other", "alpha-copy.txt")
    preview = document_info(ctx, a.document_id)
    result = delete_document(ctx, f"doc:{a.document_id}", actor="test")
    [removed] = [e for e in events(ctx, a.job_id) if e.kind == "vectors_removed"]
    return (
        preview.blob_shared_with,
        result.ok,
        result.message,
        result.blob_removed,
        result.vectors_removed,
        removed.message,
        removed.data,
    )


@pytest.mark.parametrize("other_holds_the_bytes", [False, True])
def test_a_delete_says_nothing_of_another_datasets_copy(ctx, other_holds_the_bytes):
    """Before: a delete answered blob_removed false and "1 other document(s) use the same bytes"
    when another dataset held the file, telling a key whether it did."""
    report = _delete_report(ctx, other_holds_the_bytes)
    assert report[0] == 0 and report[1] and report[3]
    assert "other document" not in report[2] and report[6]["blob_shared_with"] == 0


class Asked:
    """The session's store, noting which reads it was asked for."""

    def __init__(self, store) -> None:
        self.store, self.filters, self.by_id = store, 0, 0

    def ids_where(self, name, where):
        self.filters += 1
        return self.store.ids_where(name, where)

    def get(self, name, ids, include=None):
        self.by_id += 1
        return self.store.get(name, ids, include=include)

    def __getattr__(self, name):
        return getattr(self.store, name)


def test_a_documents_chunks_in_the_index_are_counted_by_id_not_by_a_filter(database_url, ctx):
    """The document page's count asks the store by id (a metadata filter walks the collection:
    33 ms each, two a page, at 300,000 chunks); only a job still chunking, whose ids are not known
    yet, is counted by filter. The count is the same either way, a chunk deleted behind the
    system's back included."""
    a = ingest_and_run(ctx, ALPHA, "default", "alpha.txt")
    collection = _collection(ctx)
    lost = ids_of_job(ctx, a.job_id)[:2]
    ctx.vectors.delete(collection, ids=lost)
    store = ctx.vectors
    asked = ctx.__dict__["vectors"] = Asked(store)
    try:
        counted = document_info(ctx, a.document_id).vectors
        assert (asked.filters, asked.by_id) == (0, 1)
        again = ingest_bytes(ctx, ALPHA + b" more", dataset="default", filename="pending.txt")
        assert document_info(ctx, again.document_id).vectors == 0 and asked.filters == 2
    finally:
        ctx.__dict__["vectors"] = store
    assert counted == job(ctx, a.job_id).chunk_count - 2 == len(ids_of_job(ctx, a.job_id))
