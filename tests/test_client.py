"""The Python client (sluice.client) over the whole API: a real ``sluice serve api`` process, a real
worker that finishes the jobs, the session's Redis and Chroma; the same tour for ``Client`` and
``AsyncClient``. Every call names no dataset where the key reaches one: the client finds it."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pymupdf
import pytest

from sluice.client import (
    ApiError,
    DatasetNeeded,
    Document,
    Event,
    Hit,
    Job,
    UploadedJob,
)
from tests.support.api_server import ApiServer, make_key
from tests.support.either_client import collect, opened, v, words

LEDGER = "The locked ledger lists every barrel of herring landed at the north quay in March."


def locked_pdf(password: str) -> bytes:
    doc = pymupdf.open()
    doc.new_page().insert_textbox(pymupdf.Rect(72, 72, 540, 760), LEDGER, fontsize=11)
    return doc.tobytes(
        encryption=pymupdf.PDF_ENCRYPT_AES_256,
        user_pw=password,
        owner_pw=password + "-owner",
        permissions=-1,
    )


@pytest.fixture
def api(sluice_env, tmp_path):
    server = ApiServer(dict(os.environ), tmp_path / "api.log")
    server.start()
    yield server
    server.stop()


async def _datasets_and_keys(kind: str, url: str) -> dict[str, str]:
    """Two datasets made through the client, and the keys of the tour."""
    admin = make_key("admin", datasets=None, scope="manage")
    async with opened(kind, url, admin) as c:
        made = await v(c.create_dataset("alpha"))
        assert made.ok and made.dataset.name == "alpha" and made.dataset.documents == 0
        assert (await v(c.create_dataset("beta"))).dataset.name == "beta"
        assert {"default", "alpha", "beta"} <= {d.name for d in await v(c.datasets())}
        with pytest.raises(DatasetNeeded) as needed:
            await v(c.upload_text("x", filename="x.txt"))
        assert "alpha" in str(needed.value) and "beta" in str(needed.value)
        assert (await v(c.create_dataset("alpha"))).ok  # there already: the same dataset
        with pytest.raises(ApiError) as bad:
            await v(c.create_dataset("-no"))
        assert (bad.value.status, bad.value.code) == (422, "invalid_dataset_name")
    return {
        "admin": admin,
        "app": make_key("app", datasets=["alpha"], scope="manage"),
        "two": make_key("two", datasets=["alpha", "beta"], scope="ingest"),
    }


async def _jobs_before_the_worker(c: Any) -> UploadedJob:
    """A job cancelled while nothing runs it, then retried: it runs once a worker starts."""
    pending = await v(c.upload_text(words("cancelled"), filename="cancelled.txt"))
    assert isinstance(pending, UploadedJob) and pending.status == "pending"
    stopped = await v(c.cancel(pending.job_id))
    assert stopped.ok and stopped.job.status == "cancelled" and isinstance(stopped.job, Job)
    with pytest.raises(ApiError) as refused:
        await v(c.cancel(pending.job_id))
    assert refused.value.status == 409 and refused.value.code == "action_refused"
    again = await v(c.retry(pending.job_id))
    assert again.ok and again.job.status in ("pending", "running", "succeeded")
    return pending


async def _uploads(c: Any, tmp_path) -> dict[str, UploadedJob]:
    orchard = tmp_path / "orchard.md"
    orchard.write_text(words("orchard"))
    meadow = tmp_path / "meadow.txt"
    meadow.write_text(words("meadow"))
    jobs = {
        "harbour": await v(
            c.upload(
                words("harbour").encode(),
                filename="harbour.txt",
                metadata={"lang": "en", "year": 2023},
            )
        ),
        "orchard": await v(c.upload(orchard, metadata={"lang": "de", "year": 2024})),
        "ledger": await v(c.upload(locked_pdf("sesame"), filename="ledger.pdf")),
    }
    many = await v(c.upload_many([meadow, ("quarry.txt", words("quarry").encode())]))
    assert [j.filename for j in many] == ["meadow.txt", "quarry.txt"]
    jobs |= {"meadow": many[0], "quarry": many[1]}
    same = await v(c.upload(words("harbour").encode(), filename="harbour.txt"))
    assert same.existing and same.job_id == jobs["harbour"].job_id
    return jobs


async def _search(c: Any, jobs: dict[str, UploadedJob]) -> list[Hit]:
    for mode in ("hybrid", "dense", "lexical"):
        hits = await v(c.search("harbour section", k=3, mode=mode))
        assert hits and all(isinstance(h, Hit) for h in hits) and len(hits) <= 3
    hits = await v(c.search("harbour section", k=20, mode="lexical"))
    assert {h.document_id for h in hits} == {jobs["harbour"].document_id}
    assert hits[0]["chunk_id"] == hits[0].chunk_id  # read as the dicts it used to answer
    by_filter = await v(c.search("section notes", k=50, where={"lang": "de"}))
    assert {h.document_id for h in by_filter} == {jobs["orchard"].document_id}
    ranged = await v(c.search("section notes", k=50, where={"year": {"$gte": 2023}}))
    assert {h.document_id for h in ranged} == {
        jobs["harbour"].document_id,
        jobs["orchard"].document_id,
    }
    named = await v(c.search("section notes", k=50, filename="quarry", media_type="text/plain"))
    assert {h.filename for h in named} == {"quarry.txt"}
    paged = await v(c.search("herring quay", k=5, pages="1-1", mode="lexical"))
    assert {h.filename for h in paged} == {"ledger.pdf"}
    with pytest.raises(ApiError) as bad:
        await v(c.search("x", where={"$or": []}))
    assert bad.value.status == 422
    return hits


async def _jobs_and_documents(c: Any, jobs: dict[str, UploadedJob]) -> None:
    page = await v(c.jobs(limit=1))
    assert len(page.jobs) == 1 and page.next_cursor
    every = await collect(c.iter_jobs(page_size=2))
    assert {j.id for j in every} >= {j.job_id for j in jobs.values()}
    assert len({j.id for j in every}) == len(every)
    german = await collect(c.iter_jobs(status=["succeeded"], where={"lang": "de"}, page_size=1))
    assert [j.id for j in german] == [jobs["orchard"].job_id]
    assert await collect(c.iter_jobs(status="failed")) == []

    doc = await v(c.document(jobs["harbour"].document_id))
    assert isinstance(doc, Document) and doc.metadata == {"lang": "en", "year": 2023}
    changed = await v(c.set_metadata(doc.id, {"lang": "de", "team": ["a"]}))
    assert changed.metadata == {"lang": "de", "team": ["a"]}
    listed = await v(c.list_documents(where={"lang": "de"}))
    assert {d.id for d in listed.documents} == {doc.id, jobs["orchard"].document_id}
    assert len(await collect(c.iter_documents(page_size=1))) == 6

    chunks = await v(c.chunks(doc.id, limit=1))
    assert len(chunks.chunks) == 1 and chunks.next_offset == 1
    every_chunk = await collect(c.iter_chunks(doc.id, page_size=2))
    assert len(every_chunk) == doc.chunk_count and every_chunk[0].position == 0
    first = every_chunk[0].chunk_id
    off = await v(c.set_chunk_enabled(first, False))
    assert off.enabled is False and off.document_id == doc.id
    hits = await v(c.search("harbour section", k=50, mode="lexical"))
    assert first not in {h.chunk_id for h in hits}
    assert (await v(c.set_chunk_enabled(first, True))).enabled is True


async def _versions_and_deletes(c: Any, jobs: dict[str, UploadedJob]) -> None:
    one = await v(c.upload_text(words("handbook"), filename="hb.txt", external_id="hr/handbook"))
    assert (await v(c.wait(one.job_id, timeout=120))).status == "succeeded"
    two = await v(
        c.upload_text(words("handbook two"), filename="hb.txt", external_id="hr/handbook")
    )
    assert two.replaces_document_id == one.document_id and two.version == 2
    assert (await v(c.wait(two.job_id, timeout=120))).status == "succeeded"
    [live] = await v(c.documents(external_id="hr/handbook"))
    assert (live.id, live.version, live.version_state) == (two.document_id, 2, "serving")
    gone = await v(c.delete_by_external_id("hr/handbook"))
    assert gone.ok and gone.vectors_removed > 0
    assert await v(c.documents(external_id="hr/handbook")) == []
    with pytest.raises(ApiError) as missing:
        await v(c.delete_by_external_id("hr/handbook"))
    assert missing.value.status == 404
    deleted = await v(c.delete_document(jobs["quarry"].document_id))
    assert deleted.ok and jobs["quarry"].job_id in deleted.jobs_deleted
    assert (await v(c.document(jobs["quarry"].document_id))).deleted is True


async def _events(c: Any, jobs: dict[str, UploadedJob]) -> list[Event]:
    quarry = jobs["quarry"].document_id

    def deleted(got: list[Event]) -> bool:
        return any(
            e.type == "document.deleted" and e.data["job"]["document_id"] == quarry for e in got
        )

    events = await collect(c.events(last_event_id=0, seconds=60), deleted)
    ids = [e.id for e in events]
    assert ids == sorted(set(ids))
    assert {"job.queued", "job.progress", "job.succeeded", "job.cancelled"} <= {
        e.type for e in events
    }
    assert {e.data["job"]["dataset"] for e in events} == {"alpha"}
    later = await collect(c.events(last_event_id=ids[-2], seconds=60), lambda got: True)
    assert [e.id for e in later] == [ids[-1]]
    return events


async def tour(kind: str, url: str, start_worker, tmp_path) -> None:
    keys = await _datasets_and_keys(kind, url)
    async with opened(kind, url, keys["app"]) as c:
        assert (await v(c.health())).status == "ok"
        assert (await v(c.dataset())).name == "alpha"
        cancelled = await _jobs_before_the_worker(c)
        start_worker()
        jobs = await _uploads(c, tmp_path)
        jobs["cancelled"] = cancelled
        locked = await v(c.wait(jobs["ledger"].job_id, timeout=120))
        assert (locked.status, locked.error_code) == ("failed", "password_protected")
        assert (await v(c.unlock(locked.id, "sesame"))).ok
        for name, job in jobs.items():
            done = await v(c.wait(job.job_id, timeout=120))
            assert done.status == "succeeded", (name, done.error_code, done.error_message)
        await _search(c, jobs)
        await _jobs_and_documents(c, jobs)
        await _versions_and_deletes(c, jobs)
        await _events(c, jobs)
        with pytest.raises(ApiError) as nowhere:
            await v(c.job(987654))
        assert nowhere.value.status == 404

    async with opened(kind, url, keys["two"]) as two:
        with pytest.raises(DatasetNeeded):
            await v(two.search("anything"))
        made = await v(two.upload_text(words("beta"), filename="b.txt", dataset="beta"))
        assert made.status == "pending"

    async with opened(kind, url, keys["admin"]) as admin, opened(kind, url, keys["app"]) as app:
        entries = await v(admin.audit(since="1h", action="job"))
        assert "job.cancel" in {e.action for e in entries}
        page = await v(admin.audit_page(limit=1))
        assert len(page.entries) == 1 and page.next_cursor
        done = await collect(admin.iter_audit(outcome="done", page_size=2))
        assert {e.outcome for e in done} == {"done"} and len(done) > 2
        with pytest.raises(ApiError) as no_audit:
            await v(app.audit())
        assert no_audit.value.status == 403

        assert (await v(app.dataset())).name == "alpha"  # looked up, and kept
        renamed = await v(admin.rename_dataset("alpha", "alpha-2"))
        assert renamed.dataset.name == "alpha-2"
        hits = await v(app.search("orchard section", k=1, mode="lexical"))  # found again
        assert hits and hits[0].document_id == jobs["orchard"].document_id
        assert (await v(admin.dataset("beta"))).documents == 1
        dropped = await v(admin.delete_dataset("beta"))
        assert dropped.ok
        assert "beta" not in {d.name for d in await v(admin.datasets())}


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_the_client_covers_the_api_against_a_live_server_and_worker(
    kind, api, start_worker, tmp_path
):
    asyncio.run(tour(kind, api.url, start_worker, tmp_path))
