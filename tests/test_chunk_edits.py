"""A chunk's text edited by hand (``PATCH /v1/chunks/{id}`` with ``text``, ``sluice chunks edit``):
embedded and indexed again under its id at once, in both stores; kept across a reindex and a
retry; undone by the pipeline's own text; audited. An edit that lands while a job builds the
document is in what that job serves, and of two racing edits the later one stays."""

from __future__ import annotations

import json

import httpx
import pytest
from sqlmodel import Session, select

from sluice import faults
from sluice.cli.main import main
from sluice.errors import TransientError
from sluice.ops import actions
from sluice.ops.access import Operator
from sluice.ops.chunks import BadChunkText, UnknownChunk
from sluice.ops.search import search
from sluice.pipeline.running.runner import run_job
from sluice.storage import jobs, lexical
from sluice.storage.audit_log import AuditEntry
from tests.support.api_server import InProcessApi, auth, make_key
from tests.support.helpers import collection, ids_of_job
from tests.test_metadata import MODES, upload

ALICE = Operator("alice", "operator", channel="console", address="10.1.2.3")
EDIT = "Zeppelinquartz moorings are inspected every spring by the harbour master."
LATER = "Quillfeather pontoons replaced the old moorings in the west basin."


def _stored(ctx, job_id: int, chunk_id: str) -> tuple[str, str, dict]:
    """The chunk's text in the vector store and in the word index, and its vector metadata."""
    got = ctx.vectors.get(collection(ctx), [chunk_id], include=["documents", "metadatas"])
    [row] = [r for r in lexical.job_chunks(ctx.engine, job_id, limit=500) if r.chunk_id == chunk_id]
    return got["documents"][0], row.text, got["metadatas"][0]


def _first_chunk(ctx, job_id: int) -> tuple[str, str]:
    row = lexical.job_chunks(ctx.engine, job_id, limit=1)[0]
    return row.chunk_id, row.text


def _found(ctx, query: str) -> dict[str, list[str]]:
    return {
        mode: [h.chunk_id for h in search(ctx, query=query, dataset="default", k=3, mode=mode)]
        for mode in MODES
    }


def test_an_edited_chunk_is_searched_by_its_new_text_in_every_mode(database_url, make_ctx):
    ctx = make_ctx()
    done = upload(ctx, "glacier", None, 6)
    cid, before = _first_chunk(ctx, done.id)
    assert not search(ctx, query="zeppelinquartz", dataset="default", k=3, mode="lexical")
    state = actions.edit_chunk(ALICE, cid, EDIT)
    assert (state.chunk_id, state.text, state.edited, state.enabled) == (cid, EDIT, True, True)
    vector_text, word_text, meta = _stored(ctx, done.id, cid)
    assert vector_text == word_text == EDIT and meta["edited"] is True
    for mode, ids in _found(ctx, EDIT).items():  # the new words and the new meaning find it first
        assert ids[0] == cid, mode
    assert [
        h.chunk_id
        for h in search(ctx, query="zeppelinquartz", dataset="default", k=3, mode="lexical")
    ] == [cid]
    # the same number of chunks, the same ids: nothing else moved
    assert len(ids_of_job(ctx, done.id)) == done.chunk_count
    # back to the pipeline's own text: no edit any more, in both stores
    back = actions.edit_chunk(ALICE, cid, before)
    assert back.edited is False
    vector_text, word_text, meta = _stored(ctx, done.id, cid)
    assert vector_text == word_text == before and "edited" not in meta
    assert not search(ctx, query="zeppelinquartz", dataset="default", k=3, mode="lexical")
    with Session(ctx.engine) as session:
        rows = session.exec(select(AuditEntry).where(AuditEntry.action == "chunk.edit")).all()
    assert [(r.outcome, r.target_id, r.actor_name) for r in rows] == [("done", cid, "alice")] * 2
    assert EDIT not in json.dumps([r.params for r in rows])  # the length, never the text


def test_an_edit_is_kept_across_a_reindex_and_a_retry(database_url, make_ctx):
    ctx = make_ctx()
    done = upload(ctx, "glacier", None, 6)
    cid, _ = _first_chunk(ctx, done.id)
    actions.edit_chunk(ALICE, cid, EDIT)
    with Session(ctx.engine) as session:
        assert jobs.reindex(session=session, job_ids=[done.id], actor="op")[0].ok
    assert run_job(done.id, ctx=ctx).result == "succeeded"
    vector_text, word_text, _ = _stored(ctx, done.id, cid)
    assert vector_text == word_text == EDIT
    # an attempt that fails after writing its vectors, then the retry: the edit still stands
    with Session(ctx.engine) as session:
        assert jobs.reindex(session=session, job_ids=[done.id], actor="op")[0].ok
    failed: list[int] = []

    def fail_once(**_) -> None:
        if not failed:
            failed.append(1)
            raise TransientError("injected_fault", "injected transient failure", "")

    with faults.hook("before_verify", fail_once):
        assert run_job(done.id, ctx=ctx).result == "retrying"
    assert run_job(done.id, ctx=ctx).result == "succeeded"
    vector_text, word_text, _ = _stored(ctx, done.id, cid)
    assert vector_text == word_text == EDIT
    assert [h.chunk_id for h in search(ctx, query=EDIT, dataset="default", k=1)] == [cid]


def test_an_edit_landing_while_a_reindex_builds_is_what_the_build_serves(database_url, make_ctx):
    ctx = make_ctx()
    done = upload(ctx, "glacier", None, 6)
    cid, _ = _first_chunk(ctx, done.id)
    with Session(ctx.engine) as session:
        assert jobs.reindex(session=session, job_ids=[done.id], actor="op")[0].ok
    edited = []

    def edit_now(**_) -> None:  # the build has read the edits and written its vectors
        if not edited:
            edited.append(cid)
            actions.edit_chunk(ALICE, cid, EDIT)

    with faults.hook("before_verify", edit_now):
        assert run_job(done.id, ctx=ctx).result == "succeeded"
    assert edited
    # before: the build wrote the words of the text it had read after the edit wrote its own
    vector_text, word_text, _ = _stored(ctx, done.id, cid)
    assert vector_text == word_text == EDIT
    assert [
        h.chunk_id
        for h in search(ctx, query="zeppelinquartz", dataset="default", k=3, mode="lexical")
    ] == [cid]


def test_of_two_racing_edits_the_later_one_stays(database_url, make_ctx):
    ctx = make_ctx()
    done = upload(ctx, "glacier", None, 6)
    cid, _ = _first_chunk(ctx, done.id)
    inner = []

    def second_edit(chunk_id: str) -> None:  # the first edit is recorded, not yet written
        if not inner:
            inner.append(chunk_id)  # once: the second edit hits this point too
            actions.edit_chunk(ALICE, chunk_id, LATER)

    with faults.hook("after_chunk_edit_recorded", second_edit):
        actions.edit_chunk(ALICE, cid, EDIT)
    assert inner
    vector_text, word_text, _ = _stored(ctx, done.id, cid)
    assert vector_text == word_text == LATER  # before: the first edit's write came last
    assert [
        h.chunk_id
        for h in search(ctx, query="quillfeather", dataset="default", k=3, mode="lexical")
    ] == [cid]
    assert not search(ctx, query="zeppelinquartz", dataset="default", k=3, mode="lexical")


def test_bad_text_and_unknown_chunks_are_refused_and_change_nothing(database_url, make_ctx):
    ctx = make_ctx()
    done = upload(ctx, "glacier", None, 4)
    cid, before = _first_chunk(ctx, done.id)
    for bad in ["", "   \n", "a\x00b", "x\ud800y", "w" * 20_001]:
        with pytest.raises(BadChunkText):
            actions.edit_chunk(ALICE, cid, bad)
    with pytest.raises(UnknownChunk):
        actions.edit_chunk(ALICE, "no-such-chunk", EDIT)
    assert _stored(ctx, done.id, cid)[:2] == (before, before)


def test_the_cli_edits_a_chunk(database_url, make_ctx, capsys, tmp_path):
    ctx = make_ctx()
    done = upload(ctx, "glacier", None, 4)
    cid, _ = _first_chunk(ctx, done.id)
    assert main(["chunks", "edit", cid, "--text", EDIT, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["text"], out["edited"]) == (EDIT, True)
    given = tmp_path / "new.txt"
    given.write_text(LATER, encoding="utf-8")
    assert main(["chunks", "edit", cid, "--file", str(given)]) == 0
    assert "edited, indexed again" in capsys.readouterr().out
    assert _stored(ctx, done.id, cid)[:2] == (LATER, LATER)
    assert main(["chunks", "edit", cid]) == 2  # no text given
    assert main(["chunks", "disable", cid, "--text", "x"]) == 2  # text only goes with edit
    assert main(["chunks", "edit", cid, "--text", "  "]) == 2
    assert "1 to 20,000 characters" in capsys.readouterr().err
    assert main(["chunks", "edit", "nope", "--text", EDIT]) == 1


@pytest.fixture
def api(database_url, make_ctx):
    ctx = make_ctx()
    with InProcessApi() as server:
        yield server, ctx


def test_the_api_and_the_client_edit_a_chunk(api):
    from sluice.client import Client

    server, ctx = api
    done = upload(ctx, "glacier", None, 4)
    cid, before = _first_chunk(ctx, done.id)
    token = make_key("edit", datasets=["default"], scope="ingest")
    h = auth(token)
    path = f"{server.url}/v1/chunks/{cid}"
    r = httpx.patch(path, json={"text": EDIT}, headers=h)
    assert r.status_code == 200, r.text
    assert r.json() == {
        "chunk_id": cid,
        "dataset": "default",
        "document_id": done.document_id,
        "enabled": True,
        "text": EDIT,
        "edited": True,
    }
    r = httpx.patch(path, json={"text": LATER, "enabled": False}, headers=h)  # both at once
    assert (r.json()["text"], r.json()["enabled"]) == (LATER, False), r.text
    assert _stored(ctx, done.id, cid)[:2] == (LATER, LATER)
    for body, code in [
        ({"text": ""}, "invalid_request"),
        ({"text": "w" * 20_001}, "invalid_request"),
        ({"text": 5}, "invalid_request"),
        ({"text": None}, "invalid_request"),
        ({"text": "  \t"}, "invalid_chunk_text"),
        ({"text": "a\u0000b"}, "invalid_chunk_text"),
    ]:
        r = httpx.patch(path, json=body, headers=h)
        assert (r.status_code, r.json().get("code")) == (422, code), (body, r.text)
        assert r.headers["content-type"].startswith("application/problem+json")
    assert _stored(ctx, done.id, cid)[:2] == (LATER, LATER)
    read = auth(make_key("edit-read", datasets=["default"], scope="read"))
    r = httpx.patch(path, json={"text": EDIT}, headers=read)
    assert (r.status_code, r.json()["code"]) == (403, "scope_missing"), r.text
    actions.create_dataset(ALICE, "other")
    elsewhere = auth(make_key("edit-other", datasets=["other"], scope="ingest"))
    r = httpx.patch(path, json={"text": EDIT}, headers=elsewhere)
    assert (r.status_code, r.json()["code"]) == (404, "not_found"), r.text
    with Client(server.url, token) as client:
        state = client.edit_chunk(cid, before)
    assert (state.text, state.edited, state.enabled) == (before, False, False)
    assert _stored(ctx, done.id, cid)[:2] == (before, before)


def test_an_edit_inside_a_new_versions_success_is_what_that_version_serves(database_url, make_ctx):
    from sluice.ops import settings_changes
    from sluice.storage.models import Document, Job

    ctx = make_ctx()
    done = upload(ctx, "glacier", None, 6)
    cid, _ = _first_chunk(ctx, done.id)
    actions.edit_chunk(ALICE, cid, EDIT)
    # another pipeline version whose chunks have the same texts: the edit carries over to them
    change = settings_changes.apply(ctx, "default", {"ocr_mode": "off"}, actor="op")
    assert change.ok and change.from_version != change.to_version, change.message
    with Session(ctx.engine) as session:
        new_job = session.exec(
            select(Job).where(Job.document_id == done.document_id, Job.id != done.id)
        ).one()
    inside = []

    def edit_inside(**_) -> None:  # the success has read the document, not yet switched it
        if not inside:
            inside.append(1)
            actions.edit_chunk(ALICE, cid, LATER)  # still the old version's chunk: it serves

    with faults.hook("before_supersede", edit_inside):
        assert run_job(new_job.id, ctx=ctx).result == "succeeded"
    assert inside
    with Session(ctx.engine) as session:
        assert session.get(Document, done.document_id).active_job_id == new_job.id
    [row] = [r for r in lexical.job_chunks(ctx.engine, new_job.id, limit=500) if r.position == 0]
    # before: the new version served the first edit, the second lost with the old version
    assert _stored(ctx, new_job.id, row.chunk_id)[:2] == (LATER, LATER)
    assert [h.chunk_id for h in search(ctx, query="quillfeather", dataset="default", k=1)] == [
        row.chunk_id
    ]
