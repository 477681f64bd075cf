"""Renames that race with writes (issue 39, items 6 and 8).

A dataset renamed or deleted while an upload (the HTTP API, on real uvicorn; ``sluice ingest``) or
a source's sync is writing into it: the upload names the dataset by id once resolved, so the file
lands in the renamed dataset and the key reads its own job, or a deleted one refuses it with a
classified error; no dataset is ever made again under the old name. And a document a sync renames:
the copies of its name and metadata its chunks carry follow it (dense, lexical and hybrid hits show
the new name, also when the rename lands while its first job runs), and reconcile reports a copy
left behind (name or metadata) and repairs it.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import httpx
import pytest
from sqlmodel import Session, col, select

from sluice import faults
from sluice.ops import dataset_admin
from sluice.ops.access import LOCAL_OPERATOR
from sluice.ops.ingest import ingest_bytes
from sluice.ops.metadata import set_document_metadata
from sluice.ops.search import search
from sluice.ops.sources import syncing
from sluice.pipeline.reconcile.audit import reconcile
from sluice.pipeline.running.runner import run_job
from sluice.storage.models import Dataset, Document, Job, JobStatus
from tests.support.api_server import InProcessApi, auth, make_key
from tests.support.helpers import collection

SEED = b"Lighthouse keepers log the weather every four hours through the night. " * 30
FILE = "Quarterly figures for the harbour authority: zqharbour tonnage and berths. " * 30


def dataset_named(ctx, name: str) -> Dataset | None:
    with Session(ctx.engine) as session:
        return session.exec(select(Dataset).where(Dataset.name == name)).first()


def documents_of(ctx, dataset_id: int) -> list[Document]:
    with Session(ctx.engine) as session:
        return list(session.exec(select(Document).where(Document.dataset_id == dataset_id)).all())


def once(action):
    """A hook that runs ``action`` the first time its point is hit, and never again."""
    fired = threading.Event()

    def hook(**_):
        if not fired.is_set():
            fired.set()
            action()

    hook.fired = fired  # type: ignore[attr-defined]
    return hook


def post_text(url: str, token: str, dataset: str, filename: str, text: str) -> httpx.Response:
    return httpx.post(
        f"{url}/v1/datasets/{dataset}/documents",
        json={"filename": filename, "text": text},
        headers={**auth(token), "Idempotency-Key": f"upload-{filename}"},
        timeout=30,
    )


# --- item 6: a dataset renamed or deleted inside an upload ---------------------------------------


@pytest.mark.parametrize("point", ["idempotency_before_insert", "upload_resolved"])
def test_a_dataset_renamed_inside_an_api_upload_gets_the_file(database_url, sluice_env, point):
    """The route resolved the key's dataset; the rename lands after it (before the idempotency
    record, or inside ingest before the rows are written). The file goes into the renamed
    dataset, under the key's reach: the key reads its job; no dataset is made under the old name."""
    from sluice.pipeline.running.context import get_context

    ctx = get_context()
    ingest_bytes(ctx, SEED, dataset="team", filename="seed.txt")
    team = dataset_named(ctx, "team")
    token = make_key("app", datasets=["team"], scope="ingest")
    rename = once(lambda: dataset_admin.rename(ctx, LOCAL_OPERATOR, "team", "crew"))
    with InProcessApi() as api, faults.hook(point, rename):
        answer = post_text(api.url, token, "team", "figures.txt", FILE)
        assert rename.fired.is_set(), f"the rename never ran at {point}"
        assert answer.status_code == 202, answer.text
        [made] = answer.json()["jobs"]
        own = httpx.get(f"{api.url}/v1/jobs/{made['job_id']}", headers=auth(token), timeout=30)
        assert own.status_code == 200, own.text  # the key reads its own job
    assert dataset_named(ctx, "team") is None, "a dataset was made again under the old name"
    crew = dataset_named(ctx, "crew")
    assert crew is not None and crew.id == team.id
    assert "figures.txt" in {d.filename for d in documents_of(ctx, crew.id)}
    with Session(ctx.engine) as session:
        assert session.get(Job, made["job_id"]).dataset_id == crew.id


@pytest.mark.parametrize("how", ["deleting", "deleted"])
def test_a_dataset_deleted_inside_an_api_upload_refuses_it_and_is_not_made_again(
    database_url, sluice_env, how
):
    """The dataset is marked for deletion (or deleted outright) between the upload resolving it
    and writing its rows: a classified refusal (422 dataset_deleting, 404 not_found), nothing
    stored, and no dataset made again under the name."""
    from sluice.pipeline.running.context import get_context

    ctx = get_context()
    ingest_bytes(ctx, SEED, dataset="team", filename="seed.txt")
    team = dataset_named(ctx, "team")
    token = make_key("app", datasets=["team"], scope="ingest")

    def close() -> None:
        if how == "deleted":
            assert dataset_admin.delete(ctx, LOCAL_OPERATOR, "team").ok
            return
        with Session(ctx.engine) as session:  # step 1 of a delete, the rest not yet done
            row = session.get(Dataset, team.id)
            row.deleting_at = row.created_at
            session.add(row)
            session.commit()

    closing = once(close)
    with InProcessApi() as api, faults.hook("upload_resolved", closing):
        answer = post_text(api.url, token, "team", "figures.txt", FILE)
    assert closing.fired.is_set()
    status, code = (404, "not_found") if how == "deleted" else (422, "dataset_deleting")
    assert answer.status_code == status, answer.text
    assert answer.headers["content-type"].startswith("application/problem+json")
    assert answer.json()["code"] == code, answer.json()
    with Session(ctx.engine) as session:
        rows = session.exec(select(Dataset).where(Dataset.name == "team")).all()
        assert [r.id for r in rows] == ([] if how == "deleted" else [team.id])
        assert not session.exec(select(Document).where(Document.filename == "figures.txt")).all()


@pytest.mark.parametrize("when", ["inside_the_first_upload", "between_files"])
def test_a_dataset_renamed_inside_a_cli_ingest_gets_every_file(
    database_url, sluice_env, monkeypatch, capsys, tmp_path, when
):
    """``sluice ingest a b --dataset team``: the dataset is renamed once the first file resolved
    it (inside its upload, or after it, before the second): both files land in the renamed
    dataset, by id; no dataset is made under the old name."""
    from sluice.cli import commands
    from sluice.cli.main import main
    from sluice.pipeline.running.context import get_context

    ctx = get_context()
    ingest_bytes(ctx, SEED, dataset="team", filename="seed.txt")
    team = dataset_named(ctx, "team")
    paths = [tmp_path / "a.txt", tmp_path / "b.txt"]
    for i, path in enumerate(paths):
        path.write_text(f"File {i}: " + FILE)
    rename = once(lambda: dataset_admin.rename(ctx, LOCAL_OPERATOR, "team", "crew"))
    upload_path = commands.actions.upload_path

    def first_then_rename(*args, **kwargs):
        try:
            return upload_path(*args, **kwargs)
        finally:
            rename()

    if when == "between_files":
        monkeypatch.setattr(commands.actions, "upload_path", first_then_rename)
    inside = rename if when == "inside_the_first_upload" else (lambda **_: None)
    with faults.hook("upload_resolved", inside):
        code = main(["ingest", *map(str, paths), "--dataset", "team"])
    out = capsys.readouterr()
    assert rename.fired.is_set()
    assert code == 0, out
    assert dataset_named(ctx, "team") is None, "a dataset was made again under the old name"
    crew = dataset_named(ctx, "crew")
    assert crew is not None and crew.id == team.id
    assert {"a.txt", "b.txt"} <= {d.filename for d in documents_of(ctx, crew.id)}
    with Session(ctx.engine) as session:
        jobs = session.exec(select(Job).where(col(Job.filename).in_(["a.txt", "b.txt"]))).all()
    assert len(jobs) == 2 and {j.dataset_id for j in jobs} == {crew.id}


# --- a folder source ------------------------------------------------------------------------------


def body(i: int) -> bytes:
    word = f"zq{i}w"
    return (f"Source file {i} talks about {word} and nothing else at all. " * 25 + "\n").encode()


def run_pending(ctx) -> list[int]:
    with Session(ctx.engine) as session:
        ids = session.exec(
            select(Job.id).where(col(Job.status).in_([JobStatus.pending, JobStatus.retrying]))
        ).all()
    for job_id in ids:
        assert run_job(job_id, ctx=ctx).result == "succeeded"
    return list(ids)


def share(tmp_path: Path, files: int) -> Path:
    root = tmp_path / "share"
    root.mkdir()
    for i in range(files):
        (root / f"f{i}.txt").write_bytes(body(i))
    return root


def test_a_dataset_renamed_inside_a_sync_gets_its_files(database_url, tmp_path, make_ctx):
    """The sync read its dataset when it started; the dataset is renamed while it reads the
    files: every file lands in the renamed dataset, none in a dataset made under the old name."""
    ctx = make_ctx()
    root = share(tmp_path, 3)
    syncing.add_source(ctx, name="src", dataset="docs", folder=str(root))
    docs = dataset_named(ctx, "docs")
    rename = once(lambda: dataset_admin.rename(ctx, LOCAL_OPERATOR, "docs", "papers"))
    with faults.hook("source_before_read", rename):
        done = syncing.sync(ctx, "src", actor="test", confirm=True)
    assert rename.fired.is_set()
    assert done.status == "done" and done.counts["added"] == 3, done.message
    assert dataset_named(ctx, "docs") is None, "a dataset was made again under the old name"
    papers = dataset_named(ctx, "papers")
    assert papers is not None and papers.id == docs.id
    names = sorted(d.filename for d in documents_of(ctx, papers.id))
    assert names == ["f0.txt", "f1.txt", "f2.txt"]
    assert syncing.get_source(ctx, "src").dataset == "papers"


# --- item 8: a document renamed by a sync ---------------------------------------------------------


def names_by_mode(ctx, word: str, dataset: str = "docs") -> dict[str, set[str]]:
    return {
        mode: {h.filename for h in search(ctx, query=word, dataset=dataset, k=20, mode=mode)}
        for mode in ("dense", "lexical", "hybrid")
    }


def dense_names(ctx, document_id: int, dataset: str = "docs") -> set[str]:
    """The file names the dense hits of one document show (every chunk of the dataset asked)."""
    hits = search(ctx, query="source file talks", dataset=dataset, k=100, mode="dense")
    return {h.filename for h in hits if h.document_id == document_id}


def document_by_name(ctx, filename: str) -> Document:
    with Session(ctx.engine) as session:
        return session.exec(select(Document).where(Document.filename == filename)).one()


def test_after_a_source_rename_every_hit_shows_the_new_name_and_reconcile_guards_it(
    database_url, tmp_path, make_ctx
):
    """A sync sees f1.txt moved to moved/g1.txt: the same document (nothing embedded again) is
    renamed and its chunks' copies follow it, name and metadata. A copy left behind (the name, a
    metadata key) is a metadata mismatch to reconcile, and its repair writes the row's values."""
    ctx = make_ctx()
    root = share(tmp_path, 3)
    syncing.add_source(ctx, name="src", dataset="docs", folder=str(root))
    assert syncing.sync(ctx, "src", actor="test", confirm=True).counts["added"] == 3
    assert len(run_pending(ctx)) == 3
    doc = document_by_name(ctx, "f1.txt")
    assert dense_names(ctx, doc.id) == {"f1.txt"}
    set_document_metadata(ctx, doc.id, {"team": "ops", "year": 2024})

    (root / "moved").mkdir()
    os.rename(root / "f1.txt", root / "moved" / "g1.txt")
    second = syncing.sync(ctx, "src", actor="test", confirm=True)
    assert second.counts["renamed"] == 1 and run_pending(ctx) == [], second.message
    assert document_by_name(ctx, "g1.txt").id == doc.id  # the same document, nothing embedded
    for mode, names in names_by_mode(ctx, "zq1w").items():
        assert "g1.txt" in names and "f1.txt" not in names, (mode, names)
    assert dense_names(ctx, doc.id) == {"g1.txt"}
    coll = collection(ctx, "docs")
    ids = sorted(ctx.vectors.ids_where(coll, {"document_id": doc.id}))
    assert len(ids) >= 2
    carried = ctx.vectors.get(coll, ids)["metadatas"]
    assert {(m["filename"], m["meta_team"], m["meta_year"]) for m in carried} == {
        ("g1.txt", "ops", 2024)
    }
    assert reconcile(ctx, save=False).clean

    # copies left behind (a crash between the rename and its follow): one chunk with the old
    # name, another with a metadata value the row no longer has
    stale, drifted = ids[0], ids[1]
    ctx.vectors.collection(coll).update(
        ids=[stale, drifted], metadatas=[{"filename": "f1.txt"}, {"meta_team": "sales"}]
    )
    found = reconcile(ctx, save=False)
    assert not found.clean and found.mismatched == 2, found.describe()
    [finding] = [f for f in found.findings if f.document_id == doc.id]
    assert finding.filename == "g1.txt"
    assert sorted(finding.mismatches, key=lambda m: m["id"]) == [
        {"id": stale, "fields": {"filename": ["f1.txt", "g1.txt"]}},
        {"id": drifted, "fields": {"meta_team": ["sales", "ops"]}},
    ]
    assert found.lexical_problems == {"missing": 0, "orphans": 0, "mismatched": 0}
    repaired = reconcile(ctx, repair=True, save=False)
    assert repaired.mismatched == 2 and not repaired.errors, repaired.describe()
    assert reconcile(ctx, save=False).clean
    fixed = ctx.vectors.get(coll, [stale, drifted])
    assert {(m["filename"], m["meta_team"]) for m in fixed["metadatas"]} == {("g1.txt", "ops")}
    assert sorted(fixed["ids"]) == sorted([stale, drifted])
    assert dense_names(ctx, doc.id) == {"g1.txt"}


def test_a_rename_while_the_files_first_job_runs_reaches_the_chunks_it_writes(
    database_url, tmp_path, make_ctx
):
    """The sync renames the file after its job read the document and before it wrote a chunk:
    the job's chunks carry the new name when it succeeds."""
    ctx = make_ctx()
    root = share(tmp_path, 2)
    syncing.add_source(ctx, name="src", dataset="docs", folder=str(root))
    assert syncing.sync(ctx, "src", actor="test", confirm=True).counts["added"] == 2
    doc = document_by_name(ctx, "f0.txt")
    with Session(ctx.engine) as session:
        [job_id] = session.exec(select(Job.id).where(Job.document_id == doc.id)).all()

    def rename() -> None:
        os.rename(root / "f0.txt", root / "h0.txt")
        assert syncing.sync(ctx, "src", actor="test", confirm=True).counts["renamed"] == 1

    renaming = once(rename)
    with faults.hook("after_parse", renaming):
        assert run_job(job_id, ctx=ctx).result == "succeeded"
    assert renaming.fired.is_set()
    run_pending(ctx)
    assert document_by_name(ctx, "h0.txt").id == doc.id
    assert dense_names(ctx, doc.id) == {"h0.txt"}
    assert "h0.txt" in names_by_mode(ctx, "zq0w")["hybrid"]
    assert reconcile(ctx, save=False).clean
