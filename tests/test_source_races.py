"""The sources wing on the job engine's contract, each race forced at its fault point against the
real job database (SQLite, and PostgreSQL where a transaction is in the race), the real folder and
the real index:

- an undo landing inside a tombstoned document's late success brings the document back;
- a purge and a sync's restore of one tombstone: the database lets one of them have it, and the
  file stays indexed;
- a remove during a sync waits for the sync's lease (409 naming the holder), or, the lease run
  out, takes it so that the sync stops before it uploads anything more: nothing is left that no
  source owns, and the sync ends cleanly;
- a tombstone keeps its bytes while another dataset's copy of them is deleted;
- a rename moves every version serving under the old path (an edit not yet built included);
- two sources of one dataset never share an external id;
- a new source shows its plan and uploads nothing until its first sync is confirmed;
- every source change leaves its audit row; a source removes only the documents it made.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import update
from sqlmodel import Session, col, select

from sluice import faults
from sluice.errors import OperationError
from sluice.ops.documents import delete_document
from sluice.ops.ingest import ingest_bytes
from sluice.ops.sources import syncing
from sluice.storage.models import Document, Job
from sluice.storage.source_records import SourceEntry, SourceLease
from tests.test_sources import FolderSide, body, found, job_count, run_pending


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def entries(ctx) -> dict[str, SourceEntry]:
    with Session(ctx.engine) as session:
        return {e.path: e for e in session.exec(select(SourceEntry)).all()}


def live_documents(ctx, dataset_id: int | None = None) -> list[Document]:
    with Session(ctx.engine) as session:
        query = select(Document).where(col(Document.deleted_at).is_(None))
        if dataset_id is not None:
            query = query.where(Document.dataset_id == dataset_id)
        return list(session.exec(query).all())


def docs_id(ctx) -> int:
    """The id of the dataset the sources here feed."""
    from sluice.storage.models import Dataset

    with Session(ctx.engine) as session:
        return session.exec(select(Dataset.id).where(Dataset.name == "docs")).one()


def owned_by_nothing(ctx) -> list[str]:
    """Live documents of the sources' dataset that no entry names (nothing else uploads there)."""
    named = {e.document_id for e in entries(ctx).values()}
    return [d.filename for d in live_documents(ctx, docs_id(ctx)) if d.id not in named]


def expire_lease(ctx) -> None:
    with Session(ctx.engine) as session:
        session.execute(update(SourceLease).values(expires_at=datetime(2000, 1, 1, tzinfo=UTC)))
        session.commit()


def share_of(tmp_path: Path, ctx, n: int = 4, name: str = "src") -> FolderSide:
    share = FolderSide(tmp_path / f"share-{name}")
    for i in range(n):
        share.put(f"f{i}.txt", body(i))
    share.add_source(ctx, name)
    return share


# -- an undo inside a late success ----------------------------------------------------------------


def test_an_undo_inside_a_tombstoned_documents_late_success_brings_it_back(
    database_url, tmp_path, make_ctx
):
    """Before: the success read "tombstoned" before its transaction; the undo landed after that
    read and found no searchable job to show, and the success kept the document hidden for good
    while its entry was live again."""
    ctx = make_ctx()
    share = share_of(tmp_path, ctx)
    syncing.sync(ctx, "src", confirm=True)
    steps: list[str] = []

    def inside(job_id: int, **info) -> None:  # the success read the document, before it writes
        with Session(ctx.engine) as session:
            job = session.get(Job, job_id)
        if job is None or job.filename != "f1.txt":
            return
        if not steps:  # the file leaves the source while its job runs: its document is hidden
            steps.append("removed")
            (share.root / "f1.txt").rename(tmp_path / "f1.txt")
            assert syncing.sync(ctx, "src").counts["removed"] == 1
        elif len(steps) == 1:  # the success reads again, hidden now; the operator undoes
            steps.append("undone")
            (tmp_path / "f1.txt").rename(share.root / "f1.txt")
            assert "1 tombstoned" in syncing.undo(ctx, "src")

    with faults.hook("before_supersede", inside):
        run_pending(ctx)
    assert steps == ["removed", "undone"]
    entry = entries(ctx)["f1.txt"]
    with Session(ctx.engine) as session:
        doc = session.get(Document, entry.document_id)
    assert entry.removed_at is None and doc is not None and doc.deleted_at is None
    assert doc.active_job_id is not None
    assert found(ctx, "zq1v0") == {"f1.txt"}
    assert syncing.sync(ctx, "src").counts["removed"] == 0


# -- a purge and a restore of one tombstone -------------------------------------------------------


def test_a_purge_while_a_sync_restores_the_file_leaves_it_indexed(database_url, tmp_path, make_ctx):
    """Before: the purge deleted the tombstone and its document while a sync that had planned to
    restore them was reading the file; the sync then wrote an entry naming no document, and the
    file, unchanged from then on, was never indexed again."""
    purger = make_ctx(SLUICE_SYNC_TOMBSTONE_HOURS="0")  # its tombstones have all expired
    ctx = make_ctx(SLUICE_SYNC_TOMBSTONE_HOURS="24")
    share = share_of(tmp_path, ctx)
    syncing.sync(ctx, "src", confirm=True)
    run_pending(ctx)
    (share.root / "f1.txt").rename(tmp_path / "f1.txt")
    assert syncing.sync(ctx, "src").counts["removed"] == 1 and found(ctx, "zq1v0") == set()
    (tmp_path / "f1.txt").rename(share.root / "f1.txt")  # back, the same bytes: a restore
    purged: list[int] = []

    def purge(path: str, **info) -> None:  # the sync planned the restore and reads the file
        if path == "f1.txt" and not purged:
            purged.append(syncing.purge_expired(purger))

    with faults.hook("source_before_read", purge):
        again = syncing.sync(ctx, "src")
    assert purged == [0], purged  # the sync holds the source: the purge leaves it for later
    assert again.counts["restored"] == 1, again.message
    entry = entries(ctx)["f1.txt"]
    assert entry.removed_at is None and entry.document_id is not None
    assert found(ctx, "zq1v0") == {"f1.txt"}
    assert syncing.purge_expired(purger) == 0  # nothing is a tombstone now
    assert found(ctx, "zq1v0") == {"f1.txt"}


def test_a_tombstone_taken_back_after_the_purge_chose_it_is_not_purged(
    database_url, tmp_path, make_ctx
):
    """The purge's delete of a tombstone is conditional on its row: an undo that lands between
    the purge's choice and its delete keeps the entry and its document."""
    purger = make_ctx(SLUICE_SYNC_TOMBSTONE_HOURS="0")
    ctx = make_ctx(SLUICE_SYNC_TOMBSTONE_HOURS="24")
    share = share_of(tmp_path, ctx)
    syncing.sync(ctx, "src", confirm=True)
    run_pending(ctx)
    share.delete("f2.txt")
    assert syncing.sync(ctx, "src").counts["removed"] == 1
    undone: list[str] = []

    def undo(source_ids: list[int], **info) -> None:
        undone.append(syncing.undo(ctx, "src"))

    with faults.hook("source_purge_selected", undo):
        assert syncing.purge_expired(purger) == 0
    assert undone and "1 tombstoned" in undone[0]
    assert entries(ctx)["f2.txt"].removed_at is None and found(ctx, "zq2v0") == {"f2.txt"}


# -- a remove during a sync -----------------------------------------------------------------------


def test_a_remove_during_a_sync_is_refused_while_the_sync_holds_the_source(
    database_url, tmp_path, make_ctx
):
    """Before: the remove took no lease and deleted the entries and runs under the sync, whose
    next file was uploaded and stayed live, owned by nothing, before the sync died of an
    AssertionError. Now the API answers 409 ``sync_running`` naming the sync, and the sync ends
    as planned."""
    import httpx

    from sluice.ops import actions
    from sluice.ops.access import cli_operator
    from tests.support.api_server import InProcessApi, auth, make_key

    ctx = make_ctx()
    assert actions.create_dataset(cli_operator(), "docs")[0]
    share_of(tmp_path, ctx, n=6)
    key = auth(make_key("m", datasets=["docs"], scope="manage"))
    answers: list[httpx.Response] = []
    errors: list[OperationError] = []
    with InProcessApi() as api, httpx.Client(base_url=api.url, timeout=30) as client:

        def remove(**info) -> None:  # the sync carried out its first file
            if not answers:
                answers.append(client.delete("/v1/sources/src", headers=key))
                try:
                    syncing.remove_source(ctx, "src")
                except OperationError as exc:
                    errors.append(exc)

        with faults.hook("source_applied", remove):
            result = syncing.sync(ctx, "src", confirm=True)
    [answer] = answers
    assert answer.status_code == 409, answer.text
    assert answer.json()["code"] == "sync_running" and "a sync on" in answer.json()["detail"]
    assert [e.code for e in errors] == ["sync_running"]
    assert result.status == "done" and result.counts["added"] == 6, result.message
    assert owned_by_nothing(ctx) == [] and len(entries(ctx)) == 6


def test_a_remove_that_takes_a_run_out_lease_stops_the_sync_before_its_next_upload(
    database_url, tmp_path, make_ctx
):
    """A sync whose lease ran out (a stalled process) while a remove took it uploads nothing
    more: its next upload checks the lease first; it ends as ``interrupted``, not with an
    AssertionError, and the remove deleted what the sync had made."""
    ctx = make_ctx()
    share_of(tmp_path, ctx, n=6)
    removed: list[object] = []

    def remove(**info) -> None:
        if not removed:
            expire_lease(ctx)
            removed.append(syncing.remove_source(ctx, "src"))

    with faults.hook("source_applied", remove):
        result = syncing.sync(ctx, "src", confirm=True)
    assert removed and result.status == "interrupted", result.message
    assert job_count(ctx) == 1  # the first file only: nothing was uploaded after the remove
    assert live_documents(ctx, dataset_id=docs_id(ctx)) == [] and entries(ctx) == {}


def test_an_upload_whose_entry_a_remove_forestalled_is_deleted(database_url, tmp_path, make_ctx):
    """The lease runs out between a sync's upload and the write of its entry, and a remove takes
    it: the entry's write fails its fence, and the sync deletes the document it just made (its
    source is gone), so nothing stays live that no source owns."""
    ctx = make_ctx()
    share_of(tmp_path, ctx, n=3)
    removed: list[object] = []

    def remove(path: str, **info) -> None:
        if path == "f1.txt" and not removed:
            expire_lease(ctx)
            removed.append(syncing.remove_source(ctx, "src"))

    with faults.hook("source_uploaded", remove):
        result = syncing.sync(ctx, "src", confirm=True)
    assert removed and result.status == "interrupted", result.message
    assert live_documents(ctx, dataset_id=docs_id(ctx)) == []


# -- a tombstone keeps its bytes ------------------------------------------------------------------


def test_a_tombstone_keeps_its_bytes_when_another_datasets_copy_is_deleted(tmp_path, make_ctx):
    """Before: blob users counted only documents not deleted, so deleting another dataset's copy
    of the same bytes removed the file under a tombstone; after undo its rebuild was a
    ``blob_missing`` dead letter."""
    from sluice.ops import actions
    from sluice.ops.access import cli_operator

    ctx = make_ctx()
    share = share_of(tmp_path, ctx)
    syncing.sync(ctx, "src", confirm=True)
    copy = ingest_bytes(ctx, body(1), dataset="other", filename="copy.txt")
    run_pending(ctx)
    share.delete("f1.txt")
    assert syncing.sync(ctx, "src").counts["removed"] == 1
    assert delete_document(ctx, f"doc:{copy.document_id}", actor="test").ok
    assert ctx.blobs.exists(sha(body(1))), "the tombstone's bytes went with the other copy"
    share.put("f1.txt", body(1))
    assert "1 tombstoned" in syncing.undo(ctx, "src")
    assert found(ctx, "zq1v0") == {"f1.txt"}
    doc_id = entries(ctx)["f1.txt"].document_id
    with Session(ctx.engine) as session:
        active = session.get(Document, doc_id).active_job_id
    assert actions.reindex(cli_operator(), [active]).results[0].ok  # a rebuild reads the bytes
    run_pending(ctx)
    with Session(ctx.engine) as session:
        jobs = session.exec(select(Job).where(Job.document_id == doc_id)).all()
    assert all(j.error_code != "blob_missing" for j in jobs), [j.error_code for j in jobs]
    assert found(ctx, "zq1v0") == {"f1.txt"}


# -- a rename moves every version -----------------------------------------------------------------


def test_a_file_edited_then_renamed_before_its_new_version_is_built_moves_every_version(
    database_url, tmp_path, make_ctx
):
    """Before: the rename moved only the new version (the entry's document); the old one kept
    serving under the old path and its external id, for good."""
    ctx = make_ctx()
    share = FolderSide(tmp_path / "share")
    for i in range(4):
        share.put(f"f{i}.txt", body(i))
    share.add_source(ctx)
    syncing.sync(ctx, "src", confirm=True)
    run_pending(ctx)
    share.put("f1.txt", body(1, 1))  # edited: a new version, not built yet
    assert syncing.sync(ctx, "src").counts["changed"] == 1
    share.rename("f1.txt", "g1.txt")
    assert syncing.sync(ctx, "src").counts["renamed"] == 1
    assert found(ctx, "zq1v0") == {"g1.txt"}  # the version still serving, under its new name
    run_pending(ctx)
    assert found(ctx, "zq1v1") == {"g1.txt"} and found(ctx, "zq1v0") == set()
    with Session(ctx.engine) as session:
        live = session.exec(
            select(Document.external_id).where(col(Document.deleted_at).is_(None))
        ).all()
    assert not any(ext.endswith("f1.txt") for ext in live if ext), live


# -- two sources of one dataset -------------------------------------------------------------------


def test_two_sources_of_one_dataset_with_the_same_path_keep_their_own_documents(tmp_path, make_ctx):
    """Before: the external id was the bare path, so the second source's notes.txt became a new
    version of the first source's, and replaced it in search."""
    ctx = make_ctx()
    for name, i in (("left", 1), ("right", 2)):
        share = FolderSide(tmp_path / name)
        share.put("notes.txt", body(i))
        share.add_source(ctx, name)
        assert syncing.sync(ctx, name, confirm=True).counts["added"] == 1
    run_pending(ctx)
    assert found(ctx, "zq1v0") == {"notes.txt"} and found(ctx, "zq2v0") == {"notes.txt"}
    with Session(ctx.engine) as session:
        ids = set(
            session.exec(
                select(Document.external_id).where(col(Document.deleted_at).is_(None))
            ).all()
        )
    assert ids == {"left:notes.txt", "right:notes.txt"}


def test_an_entry_of_before_keeps_its_documents_external_id(tmp_path, make_ctx):
    """An entry written when the id was the bare path (no id of its own) goes on under it: an
    edit becomes a new version of that same document."""
    ctx = make_ctx()
    share = share_of(tmp_path, ctx, n=2)
    syncing.sync(ctx, "src", confirm=True)
    run_pending(ctx)
    with Session(ctx.engine) as session:  # as an older Sluice wrote them
        for entry in session.exec(select(SourceEntry)).all():
            doc = session.get(Document, entry.document_id)
            doc.external_id = entry.path
            entry.external_id = None
            entry.owned = None
            session.add_all([doc, entry])
        session.commit()
    share.put("f1.txt", body(1, 1))
    assert syncing.sync(ctx, "src").counts["changed"] == 1
    run_pending(ctx)
    assert found(ctx, "zq1v1") == {"f1.txt"} and found(ctx, "zq1v0") == set()
    with Session(ctx.engine) as session:
        live = session.exec(
            select(Document.external_id).where(col(Document.deleted_at).is_(None))
        ).all()
    assert sorted(live) == ["f0.txt", "f1.txt"]


# -- a new source waits for its confirmed first sync ----------------------------------------------


def test_a_new_source_shows_its_plan_and_uploads_nothing_until_confirmed(tmp_path, ctx, capsys):
    """Before: ``sources add`` ingested at once (the watch synced within a second), so the
    README's "preview first" always showed nothing."""
    from sluice.cli.main import main
    from sluice.ops.sources import follow
    from sluice.pipeline.queueing import recovery

    share = FolderSide(tmp_path / "share")
    for i in range(3):
        share.put(f"f{i}.txt", body(i))
    folder = str(share.root)
    try:
        args = ["sources", "add", "s", "--dataset", "docs", "--folder", folder, "--every", "1m"]
        assert main(args) == 0
        out = capsys.readouterr().out
        assert "3 to add" in out and "sluice sync s --yes" in out, out
        assert recovery.run_extra_rounds(ctx, [follow.follow_round]) == []  # no schedule yet
        assert "s" not in follow._watching  # nor a watch
        assert main(["sync", "s"]) == 3 and "waits for confirmation" in capsys.readouterr().out
        assert job_count(ctx) == 0 and syncing.get_source(ctx, "s").state == "unconfirmed"
        assert main(["sync", "s", "--yes"]) == 0 and job_count(ctx) == 3
        view = syncing.get_source(ctx, "s")
        assert view.confirmed and view.next_run_at is not None
    finally:
        follow.stop_watching()


# -- the audit trail and what a source owns -------------------------------------------------------


def test_every_source_change_leaves_an_audit_row(tmp_path, ctx):
    """Before: add, sync, undo and remove (and the uploads and deletes they caused) left no row."""
    import httpx

    from sluice.ops import audit_trail
    from sluice.ops.access import cli_operator
    from sluice.ops.sources import manage
    from tests.support.api_server import InProcessApi, auth, make_key

    share = FolderSide(tmp_path / "share")
    for i in range(4):
        share.put(f"f{i}.txt", body(i))
    who = cli_operator()
    manage.add(who, name="src", dataset="docs", folder=str(share.root))
    manage.sync(who, "src", confirm=True)
    share.delete("f3.txt")
    manage.sync(who, "src")
    manage.undo(who, "src")
    manage.remove(who, "src")
    rows = list(reversed(audit_trail.rows(action="source")))
    assert [r["action"] for r in rows] == [
        "source.add",
        "source.sync",
        "source.sync",
        "source.undo",
        "source.remove",
    ]
    assert {(r["actor_name"], r["target_id"], r["dataset"], r["outcome"]) for r in rows} == {
        (who.name, "src", "docs", "done")
    }
    first, second = rows[1]["params"], rows[2]["params"]
    assert first["added"] == 4 and len(first["documents"]) == 4 and second["removed"] == 1
    assert rows[3]["params"]["restored"] == 1 and rows[4]["params"]["deleted"] == 4
    key = auth(make_key("auditor", datasets=None, scope="manage"))
    with InProcessApi() as api, httpx.Client(base_url=api.url, timeout=30) as client:
        listed = client.get("/v1/audit", params={"action": "source"}, headers=key).json()
    assert [e["action"] for e in listed["entries"]][::-1] == [r["action"] for r in rows]


def test_a_source_removes_only_the_documents_it_made(tmp_path, make_ctx):
    """Before: a file with the same bytes as a document the dataset already had became the
    source's entry, and deleting the source (or the file) deleted the dataset's own document."""
    ctx = make_ctx()
    mine = ingest_bytes(ctx, body(1), dataset="docs", filename="mine.txt")
    run_pending(ctx)
    share = share_of(tmp_path, ctx)  # f1.txt holds the same bytes as mine.txt
    syncing.sync(ctx, "src", confirm=True)
    run_pending(ctx)
    assert found(ctx, "zq1v0") == {"mine.txt"} and found(ctx, "zq2v0") == {"f2.txt"}
    share.delete("f1.txt")
    assert syncing.sync(ctx, "src").counts["removed"] == 1
    assert found(ctx, "zq1v0") == {"mine.txt"}  # not the source's to hide
    share.put("f1.txt", body(1))
    syncing.sync(ctx, "src")
    removed = syncing.remove_source(ctx, "src")
    message = str(getattr(removed, "message", removed))
    assert "1 kept" in message and "before the source" in message, message
    assert found(ctx, "zq1v0") == {"mine.txt"} and found(ctx, "zq2v0") == set()
    with Session(ctx.engine) as session:
        doc = session.get(Document, mine.document_id)
    assert doc.deleted_at is None


@pytest.fixture(autouse=True)
def _no_watchers():
    yield
    from sluice.ops.sources import follow

    follow.stop_watching()
