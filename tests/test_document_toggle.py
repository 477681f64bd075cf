"""A document switched off keeps its chunks in both stores, shows as disabled, and leaves every
search (each mode, every dataset, the hit-testing page, ``sluice search``, the API); switched on,
it answers again. The switch is audited, survives a reindex, a re-upload and a new version by
external id, and a search sees a document whole or not at all while it flips."""

from __future__ import annotations

import json
import threading

import httpx
import pytest
from sqlmodel import Session, select

from sluice import faults
from sluice.cli.main import main
from sluice.ops import actions, document_switch, hit_testing, reads
from sluice.ops.access import Operator
from sluice.ops.document_view import view
from sluice.ops.ingest import ingest_bytes
from sluice.ops.metadata import UnknownDocument
from sluice.ops.search import search
from sluice.pipeline.running.runner import run_job
from sluice.storage import jobs
from sluice.storage.audit_log import AuditEntry
from sluice.storage.models import Document
from tests.support.api_server import InProcessApi, auth, make_key
from tests.support.helpers import collection, ids_of_job
from tests.test_metadata import MODES, upload

ALICE = Operator("alice", "operator", channel="console", address="10.1.2.3")
QUERY = "harbour section"


def _documents(ctx, query: str = QUERY, k: int = 200) -> dict[str, set[int]]:
    return {
        mode: {h.document_id for h in search(ctx, query=query, dataset="default", k=k, mode=mode)}
        for mode in MODES
    }


def _audit(ctx, action: str) -> list[AuditEntry]:
    with Session(ctx.engine) as session:
        rows = session.exec(select(AuditEntry).order_by(AuditEntry.id)).all()
    return [r for r in rows if r.action == action]


def test_a_disabled_document_leaves_every_search_and_comes_back(database_url, make_ctx, capsys):
    ctx = make_ctx()
    off = upload(ctx, "glacier", None, 6)
    other = upload(ctx, "pier", None, 6)
    assert all({off.document_id, other.document_id} <= found for found in _documents(ctx).values())
    state = actions.set_document_enabled(ALICE, off.document_id, False)
    assert (state.enabled, state.disabled_by) == (False, "console:alice") and state.disabled_at
    again = actions.set_document_enabled(ALICE, off.document_id, False)  # twice is once
    assert again.disabled_at == state.disabled_at
    # every mode, every dataset, hit testing and the CLI leave it out, and still answer k others
    for mode, found in _documents(ctx).items():
        assert found == {other.document_id}, mode
    for mode in MODES:
        hits = search(ctx, query=QUERY, dataset="default", k=other.chunk_count, mode=mode)
        assert len(hits) == other.chunk_count, mode
    assert {h.document_id for h in reads.search(QUERY, None, 100)} == {other.document_id}
    tested = hit_testing.run(ALICE, query=QUERY, dataset="default", k=100, mode="hybrid")
    assert {h.document_id for h in tested.hits} == {other.document_id}
    assert main(["search", QUERY, "--k", "100", "--json"]) == 0  # every dataset, as the console
    printed = json.loads(capsys.readouterr().out)
    assert {h["document_id"] for h in printed} == {other.document_id}
    # kept in both stores, shown as disabled
    ids = ids_of_job(ctx, off.id)
    assert len(ctx.vectors.get(collection(ctx), ids)["ids"]) == off.chunk_count
    shown = view(ctx, f"doc:{off.document_id}")
    assert (shown.enabled, shown.served_count, shown.chunk_count) == (False, 0, off.chunk_count)
    assert shown.to_dict()["enabled"] is False
    # switched on again: every mode answers it
    assert actions.set_document_enabled(ALICE, off.document_id, True).enabled
    assert all(off.document_id in found for found in _documents(ctx).values())
    assert view(ctx, f"doc:{off.document_id}").served_count == off.chunk_count
    # audited: who, what; a refusal too
    with pytest.raises(UnknownDocument):
        actions.set_document_enabled(ALICE, 999_999, False)
    disabled = _audit(ctx, "document.disable")
    assert [(r.outcome, r.target_id) for r in disabled] == [
        ("done", str(off.document_id)),
        ("done", str(off.document_id)),
        ("refused", "999999"),
    ]
    assert disabled[0].actor_name == "alice"
    assert [r.outcome for r in _audit(ctx, "document.enable")] == ["done"]


def test_the_cli_switches_a_document(database_url, make_ctx, capsys):
    ctx = make_ctx()
    done = upload(ctx, "glacier", None, 4)
    assert main(["documents", str(done.document_id), "--disable", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["enabled"] is False
    assert all(not found for found in _documents(ctx).values())
    assert main(["documents", str(done.document_id), "--enable"]) == 0
    assert "enabled" in capsys.readouterr().out
    assert all(found == {done.document_id} for found in _documents(ctx).values())
    assert main(["documents", "--disable"]) == 2
    assert main(["documents", "424242", "--disable"]) == 1


def test_the_switch_survives_a_reindex_and_a_re_upload(database_url, make_ctx):
    ctx = make_ctx()
    done = upload(ctx, "glacier", None, 4)
    document_switch.set_document_enabled(ctx, done.document_id, False, actor="op")
    with Session(ctx.engine) as session:
        assert jobs.reindex(session=session, job_ids=[done.id], actor="op")[0].ok
    assert run_job(done.id, ctx=ctx).result == "succeeded"
    assert all(not found for found in _documents(ctx).values())
    again = ingest_bytes(ctx, _bytes_of(ctx, done.document_id), dataset="default", filename="x.txt")
    assert again.accepted and again.document_id == done.document_id
    assert document_switch.state(ctx, done.document_id).enabled is False
    assert all(not found for found in _documents(ctx).values())
    # deleted and uploaded again: the same document row comes back, still switched off
    body = _bytes_of(ctx, done.document_id)
    assert actions.delete_document(ALICE, f"doc:{done.document_id}").ok
    back = ingest_bytes(ctx, body, dataset="default", filename="x.txt")
    assert back.accepted and back.document_id == done.document_id
    assert run_job(back.job_id, ctx=ctx).result == "succeeded"
    assert document_switch.state(ctx, done.document_id).enabled is False
    assert all(not found for found in _documents(ctx).values())
    document_switch.set_document_enabled(ctx, done.document_id, True, actor="op")
    assert all(found == {done.document_id} for found in _documents(ctx).values())


def _bytes_of(ctx, document_id: int) -> bytes:
    with Session(ctx.engine) as session:
        doc = session.get(Document, document_id)
    with ctx.blobs.local_copy(doc.blob_key) as path:
        return path.read_bytes()


def _version(ctx, body: bytes):
    r = ingest_bytes(ctx, body, dataset="default", filename="hb.txt", external_id="handbook")
    assert r.accepted, r.message
    return r


def test_a_new_version_takes_over_the_switch_when_it_starts_serving(database_url, make_ctx):
    from tests.test_reconcile import text

    ctx = make_ctx()
    v1 = _version(ctx, text("harbour", 4))
    assert run_job(v1.job_id, ctx=ctx).result == "succeeded"
    document_switch.set_document_enabled(ctx, v1.document_id, False, actor="op")
    v2 = _version(ctx, text("harbour", 5))
    assert run_job(v2.job_id, ctx=ctx).result == "succeeded"
    assert document_switch.state(ctx, v2.document_id).enabled is False
    assert all(not found for found in _documents(ctx).values())
    # switched on while the next version is built: that one serves switched on
    v3 = _version(ctx, text("harbour", 6))
    document_switch.set_document_enabled(ctx, v2.document_id, True, actor="op")
    assert run_job(v3.job_id, ctx=ctx).result == "succeeded"
    assert document_switch.state(ctx, v3.document_id).enabled is True
    assert all(found == {v3.document_id} for found in _documents(ctx).values())
    # a switch on its way while the version it names is replaced lands on the new one
    v4 = _version(ctx, text("harbour", 7))

    def replace_now(document_id: int) -> None:
        if document_id == v3.document_id:
            assert run_job(v4.job_id, ctx=ctx).result == "succeeded"

    with faults.hook("before_document_switch", replace_now):
        state = document_switch.set_document_enabled(ctx, v3.document_id, False, actor="op")
    assert (state.document_id, state.enabled) == (v4.document_id, False)
    assert all(not found for found in _documents(ctx).values())
    with pytest.raises(UnknownDocument):  # a replaced version is no document to switch
        document_switch.set_document_enabled(ctx, v1.document_id, True, actor="op")


def test_a_search_sees_a_flipping_document_whole_or_not_at_all(database_url, make_ctx):
    ctx = make_ctx()
    done = upload(ctx, "glacier", None, 6)
    flips = []
    flipped = threading.Semaphore(0)

    def flip(ranker: str, **_) -> None:
        # Hybrid's rankers run at once: the dense one waits until the lexical one has read and the
        # document has gone off (then on), so the two read on either side of the flip.
        if ranker == "dense":
            assert flipped.acquire(timeout=60)
            return
        on = len(flips) % 2 == 1
        flips.append(on)
        document_switch.set_document_enabled(ctx, done.document_id, on, actor="op")
        flipped.release()

    with faults.hook("search_between_rankers", flip):
        for _ in range(4):
            hits = search(ctx, query=QUERY, dataset="default", k=200, mode="hybrid")
            # the state after the flip, in full: never the off version in one ranker only
            assert len(hits) == (done.chunk_count if flips[-1] else 0), (flips, len(hits))
    assert len(flips) >= 4


@pytest.fixture
def api(database_url, make_ctx):
    ctx = make_ctx()
    with InProcessApi() as server:
        yield server, ctx


def test_the_api_switches_a_document_off_and_on(api):
    server, ctx = api
    url = server.url
    h = auth(make_key("doc-switch", datasets=None, scope="ingest"))
    read = auth(make_key("doc-switch-read", datasets=None, scope="read"))
    done = upload(ctx, "glacier", None, 4)
    other = upload(ctx, "pier", None, 4)

    def searched() -> set[int]:
        found = set()
        for mode in MODES:
            r = httpx.post(
                f"{url}/v1/datasets/default/search",
                json={"query": QUERY, "k": 50, "mode": mode},
                headers=h,
                timeout=30,
            )
            assert r.status_code == 200, r.text
            found |= {hit["document_id"] for hit in r.json()["hits"]}
        return found

    path = f"{url}/v1/documents/{done.document_id}"
    assert httpx.get(path, headers=h).json()["enabled"] is True
    r = httpx.patch(path, json={"enabled": False}, headers=h)
    assert r.status_code == 200 and r.json()["enabled"] is False, r.text
    assert r.json()["disabled_at"] and r.json()["id"] == done.document_id
    assert httpx.get(path, headers=h).json()["enabled"] is False
    assert searched() == {other.document_id}
    chunks = httpx.get(f"{path}/chunks", headers=h).json()["chunks"]
    assert len(chunks) == done.chunk_count  # kept, listed
    for body, status, code in [
        ({}, 422, "invalid_request"),
        ({"enabled": "maybe"}, 422, "invalid_request"),
        ({"enabled": False, "owner": "x"}, 422, "invalid_request"),
        ({"enabled": None}, 422, "invalid_request"),
    ]:
        r = httpx.patch(path, json=body, headers=h)
        assert (r.status_code, r.json().get("code")) == (status, code), (body, r.text)
    r = httpx.patch(path, json={"enabled": True}, headers=read)
    assert (r.status_code, r.json()["code"]) == (403, "scope_missing"), r.text
    r = httpx.patch(f"{url}/v1/documents/987654", json={"enabled": True}, headers=h)
    assert (r.status_code, r.json()["code"]) == (404, "not_found"), r.text
    r = httpx.patch(path, json={"enabled": True, "metadata": {"lang": "de"}}, headers=h)
    assert r.status_code == 200 and r.json()["enabled"] is True, r.text
    assert r.json()["metadata"] == {"lang": "de"}
    assert searched() == {done.document_id, other.document_id}
    assert [e.outcome for e in _audit(ctx, "document.disable")] == ["done"]


def test_the_document_page_switches_the_document_off_and_on(ctx):
    from tests.support.apptest import assert_ok, open_console, texts

    done = upload(ctx, "glacier", None, 4)
    at = open_console("document", query={"doc": f"doc:{done.document_id}"})
    assert_ok(at)
    at.button(key="document_switch").click().run()
    assert_ok(at)
    assert document_switch.state(ctx, done.document_id).enabled is False
    assert "Disabled by" in texts(at) and "no search answers them" in texts(at)
    assert all(not found for found in _documents(ctx).values())
    assert at.button(key="document_switch").proto.label == "Enable this document"
    at.button(key="document_switch").click().run()
    assert document_switch.state(ctx, done.document_id).enabled is True
    assert "Disabled by" not in texts(at)
