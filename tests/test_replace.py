"""External ids: new bytes under a known id replace the served version without a gap (search never
answers both versions, nor neither), a failed replacement leaves the old version serving and says
so, the same bytes again are the same job, delete by external id, uniqueness per dataset."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import httpx
import pytest
from sqlmodel import Session

from sluice import faults
from sluice.cli.main import main as cli
from sluice.client import ApiError, Client
from sluice.ops.documents import find_by_external_id
from sluice.ops.ingest import ingest_bytes
from sluice.ops.replacing import delete_by_external_id, version_state
from sluice.ops.search import search
from sluice.pipeline.reconcile.audit import reconcile
from sluice.pipeline.running.runner import run_job
from sluice.storage.models import Document, JobStatus
from tests.support.api_server import InProcessApi, auth, make_key
from tests.support.apptest import assert_ok, open_console, texts
from tests.support.helpers import Background, ids_of_job, job, until, wait_for

OLD = b"Albatross migration routes cross the southern ocean every winter season. " * 40
NEW = b"Albatross migration routes now cross the northern ocean every summer season. " * 40
CORRUPT = b"%PDF-1.7\n1 0 obj <<>> garbage that is no PDF at all\n" * 4


def document(ctx, document_id):
    with Session(ctx.engine) as session:
        return session.get(Document, document_id)


def upload(ctx, data, *, external_id="handbook", dataset="default", filename="handbook.txt"):
    r = ingest_bytes(ctx, data, dataset=dataset, filename=filename, external_id=external_id)
    assert r.accepted, r.message
    return r


def upload_and_run(ctx, data, **kw):
    r = upload(ctx, data, **kw)
    run_job(r.job_id, ctx=ctx)
    return r


def served(ctx, query="albatross ocean season", dataset="default", mode="hybrid"):
    """The document ids search answers (each document once)."""
    return {h.document_id for h in search(ctx, query=query, dataset=dataset, k=10, mode=mode)}


def test_new_bytes_under_a_known_external_id_replace_the_served_version(database_url, ctx):
    v1 = upload_and_run(ctx, OLD)
    assert v1.version == 1 and find_by_external_id(ctx, "default", "handbook") == v1.document_id
    v2 = upload(ctx, NEW)
    assert not v2.duplicate and v2.version == 2 and v2.replaces_document_id == v1.document_id
    # Until its job succeeds the old version serves, and only it.
    assert served(ctx) == {v1.document_id}
    assert version_state(ctx, v2.document_id).state == "replacing"
    assert find_by_external_id(ctx, "default", "handbook") == v1.document_id
    run_job(v2.job_id, ctx=ctx)
    assert job(ctx, v2.job_id).status == JobStatus.succeeded
    for mode in ("hybrid", "dense", "lexical"):
        assert served(ctx, mode=mode) == {v2.document_id}
    old = document(ctx, v1.document_id)
    assert old.deleted_at is not None and old.replaced_by == v2.document_id
    assert job(ctx, v1.job_id).status == JobStatus.deleted
    assert ids_of_job(ctx, v1.job_id) == []  # the old chunks are gone from Chroma
    assert not ctx.blobs.exists(old.blob_key)  # and the old bytes (no other document has them)
    assert ctx.blobs.exists(document(ctx, v2.document_id).blob_key)
    assert find_by_external_id(ctx, "default", "handbook") == v2.document_id
    assert version_state(ctx, v1.document_id).state == "replaced"
    assert version_state(ctx, v2.document_id).state == "serving"
    report = reconcile(ctx)
    assert report.clean, report


def test_the_same_bytes_under_the_same_external_id_are_the_existing_job(ctx):
    v1 = upload_and_run(ctx, OLD)
    again = upload(ctx, OLD)
    assert again.duplicate and again.job_id == v1.job_id and again.version == 1
    v2 = upload(ctx, NEW)
    assert upload(ctx, NEW).job_id == v2.job_id  # the candidate, too


def test_a_failed_replacement_leaves_the_old_version_serving_and_says_so(database_url, ctx):
    v1 = upload_and_run(ctx, OLD)
    bad = upload_and_run(ctx, CORRUPT, filename="handbook.pdf")
    assert job(ctx, bad.job_id).status == JobStatus.failed
    assert served(ctx) == {v1.document_id}
    state = version_state(ctx, bad.document_id)
    assert state.state == "replacement_failed"
    assert state.message == "replacement failed; version 1 still serving"
    assert find_by_external_id(ctx, "default", "handbook") == v1.document_id
    live = version_state(ctx, v1.document_id).message
    assert live == "version 1 (live); version 2 (replacement) failed"
    assert reconcile(ctx).clean
    if database_url.startswith("sqlite"):  # the console says it on the document's page
        at = open_console("document", query={"doc": f"doc:{bad.document_id}"})
        assert "External id handbook: replacement failed; version 1 still serving" in texts(at)


def test_a_first_version_that_failed_is_not_called_live(ctx):
    """Nothing serves the id when its only version failed: not "version 1 (live)"."""
    bad = upload_and_run(ctx, CORRUPT, filename="handbook.pdf")
    assert job(ctx, bad.job_id).status == JobStatus.failed
    state = version_state(ctx, bad.document_id)
    assert state.state == "failed"
    assert state.message == "version 1 failed: no version serving"
    assert served(ctx) == set()
    fixed = upload_and_run(ctx, OLD)  # a good version afterwards is live as usual
    assert version_state(ctx, fixed.document_id).message == "version 2 (live)"


def test_the_bytes_of_a_replaced_version_come_back_as_the_newest_version(ctx):
    v1 = upload_and_run(ctx, OLD)
    v2 = upload_and_run(ctx, NEW)
    back = upload(ctx, OLD)
    assert back.document_id == v1.document_id and back.job_id == v1.job_id and not back.duplicate
    assert (back.version, back.replaces_document_id) == (3, v2.document_id)
    assert served(ctx) == {v2.document_id}
    run_job(back.job_id, ctx=ctx)
    assert served(ctx) == {v1.document_id}
    assert find_by_external_id(ctx, "default", "handbook") == v1.document_id
    assert reconcile(ctx).clean


def test_a_newer_upload_supersedes_a_replacement_still_waiting(ctx):
    v1 = upload_and_run(ctx, OLD)
    v2 = upload(ctx, NEW)
    v3 = upload(ctx, NEW + b" third")
    assert v3.version == 3 and v3.replaces_document_id == v1.document_id
    assert job(ctx, v2.job_id).status == JobStatus.deleted  # never runs
    assert not ctx.blobs.exists(document(ctx, v2.document_id).blob_key)
    assert version_state(ctx, v2.document_id).state == "superseded"
    run_job(v3.job_id, ctx=ctx)
    assert served(ctx) == {v3.document_id}
    assert find_by_external_id(ctx, "default", "handbook") == v3.document_id
    assert reconcile(ctx).clean


def test_a_newer_upload_stops_a_replacement_that_is_running(database_url, ctx):
    v1 = upload_and_run(ctx, OLD)
    v2 = upload(ctx, NEW)
    newer = []

    def upload_meanwhile(**_):  # v2's chunks are written, its success not yet recorded
        if not newer:
            newer.append(upload(ctx, NEW + b" third"))

    with faults.hook("after_index", upload_meanwhile):
        outcome = run_job(v2.job_id, ctx=ctx)
    assert outcome.result == "lost" and job(ctx, v2.job_id).status == JobStatus.deleted
    assert ids_of_job(ctx, v2.job_id) == []  # its chunks went with it
    assert served(ctx) == {v1.document_id}
    run_job(newer[0].job_id, ctx=ctx)
    assert served(ctx) == {newer[0].document_id}
    assert reconcile(ctx).clean


def test_delete_by_external_id_and_uniqueness_per_dataset(ctx):
    a = upload_and_run(ctx, OLD)
    b = upload_and_run(ctx, OLD, dataset="other")  # the same id in another dataset is its own
    assert a.document_id != b.document_id
    assert find_by_external_id(ctx, "other", "handbook") == b.document_id
    # Bytes already a live document under another id are refused, classified.
    clash = ingest_bytes(ctx, OLD, dataset="default", filename="x.txt", external_id="other-id")
    assert not clash.accepted and clash.error_code == "external_id_conflict"
    candidate = upload(ctx, NEW)
    done = delete_by_external_id(ctx, "default", "handbook", actor="test")
    assert done.ok, done.message
    assert find_by_external_id(ctx, "default", "handbook") is None
    assert document(ctx, candidate.document_id).deleted_at is not None
    assert served(ctx) == set() and served(ctx, dataset="other") == {b.document_id}
    missing = delete_by_external_id(ctx, "default", "handbook", actor="test")
    assert not missing.ok and missing.document is None
    assert reconcile(ctx).clean


def test_bad_external_ids_are_refused_before_anything_is_stored(ctx):
    for bad, why in (("", "empty"), ("a\x00b", "U+0000"), ("x" * 513, "over 512")):
        r = ingest_bytes(ctx, OLD, dataset="default", filename="a.txt", external_id=bad)
        assert not r.accepted and r.error_code == "bad_external_id" and why in r.message
    assert served(ctx) == set()


class Searcher(Background):
    """Asks throughout, in every mode, and counts each answer: neither version (a miss), both (a
    double), or which one it was."""

    def __init__(self, ctx, versions: tuple[int, int], *, limit: int = 5000) -> None:
        super().__init__(name="searcher")
        self.ctx, self.versions, self.limit = ctx, set(versions), limit
        self.stop = threading.Event()
        self.asked = 0
        self.misses = self.doubles = 0
        self.answers: list[int] = []

    def work(self):
        modes = ("hybrid", "dense", "lexical")
        while not self.stop.is_set() and self.asked < self.limit:
            got = served(self.ctx, mode=modes[self.asked % 3]) & self.versions
            self.asked += 1
            if not got:
                self.misses += 1
            elif len(got) > 1:
                self.doubles += 1
            else:
                self.answers.append(got.pop())

    def ask(self, more: int, what: str) -> None:
        """Hold until it asked ``more`` times from now (bounded)."""
        start = self.asked
        until(lambda: self.check() or self.asked >= start + more, timeout=60, what=what)


@pytest.mark.slow
def test_a_replacement_under_continuous_search_never_answers_both_nor_neither(
    database_url, ctx, start_worker, tmp_path
):
    v1 = upload_and_run(ctx, OLD)
    built, switched = tmp_path / "built", tmp_path / "switched"
    # The worker holds the new version twice: chunks written but not yet serving, and serving with
    # the old chunks not yet removed. Both windows have both chunk sets in both stores.
    start_worker(env={"SLUICE_FAULTS": f"after_index=wait:{built},after_switch=wait:{switched}"})
    v2 = upload(ctx, NEW)
    searcher = Searcher(ctx, (v1.document_id, v2.document_id))
    searcher.start()
    try:
        until(lambda: Path(f"{built}.waiting").exists(), timeout=60, what="new chunks written")
        assert ids_of_job(ctx, v1.job_id) and ids_of_job(ctx, v2.job_id)
        searcher.ask(12, "searches while both versions are in the stores, the old one serving")
        before = len(searcher.answers)
        built.touch()
        until(lambda: Path(f"{switched}.waiting").exists(), timeout=60, what="the switch")
        assert ids_of_job(ctx, v1.job_id) and ids_of_job(ctx, v2.job_id)
        searcher.ask(12, "searches after the switch, the old chunks still in the stores")
        switched.touch()
        wait_for(ctx, [v2.job_id])
        # The runner's last step after the switch: the old chunks went first, then the old bytes.
        old_blob = document(ctx, v1.document_id).blob_key
        until(lambda: not ctx.blobs.exists(old_blob), timeout=60, what="the old version removed")
        searcher.ask(6, "searches after the old chunks went")
    finally:
        built.touch()
        switched.touch()
        searcher.stop.set()
    searcher.result(timeout=60)
    assert job(ctx, v2.job_id).status == JobStatus.succeeded
    assert (searcher.misses, searcher.doubles) == (0, 0), searcher.asked
    answers = searcher.answers
    assert set(answers[:before]) == {v1.document_id}  # the old version served until the switch
    assert answers[-6:] == [v2.document_id] * 6
    assert answers == sorted(answers, key=lambda d: d == v2.document_id)  # one switch, no way back
    assert ids_of_job(ctx, v1.job_id) == []
    assert reconcile(ctx).clean


def test_the_api_routes_of_external_ids(ctx):
    with InProcessApi() as api:
        c = httpx.Client(
            base_url=api.url, headers=auth(make_key("k", datasets=None, scope="manage")), timeout=30
        )
        r = c.post(
            "/v1/datasets/default/documents",
            json={"filename": "h.txt", "text": OLD.decode(), "external_id": "hb/1"},
        )
        assert r.status_code == 202, r.text
        v1 = r.json()["jobs"][0]
        assert (v1["external_id"], v1["version"]) == ("hb/1", 1)
        run_job(v1["job_id"], ctx=ctx)
        r = c.post(
            "/v1/datasets/default/documents",
            files={"file": ("h.txt", NEW)},
            data={"external_id": "hb/1"},
        )
        assert r.status_code == 202, r.text
        v2 = r.json()["jobs"][0]
        assert v2["version"] == 2 and v2["replaces_document_id"] == v1["document_id"]
        [live] = c.get("/v1/documents", params={"external_id": "hb/1"}).json()["documents"]
        assert live["id"] == v1["document_id"]
        assert live["version_message"] == "version 1 (live); version 2 (replacement) being built"
        run_job(v2["job_id"], ctx=ctx)
        found = c.get("/v1/documents", params={"external_id": "hb/1", "dataset": "default"})
        [live] = found.json()["documents"]
        assert (live["id"], live["version_state"]) == (v2["document_id"], "serving")
        old = c.get(f"/v1/documents/{v1['document_id']}").json()
        assert old["version_state"] == "replaced" and old["replaced_by"] == v2["document_id"]
        old_job = c.get(f"/v1/jobs/{v1['job_id']}").json()
        assert old_job["version_message"] == (
            f"replaced by document {v2['document_id']}; version 2 still serving"
        )
        refusals = {
            "empty": c.post(
                "/v1/datasets/default/documents",
                json={"filename": "a.txt", "text": "x", "external_id": ""},
            ),
            "control": c.post(
                "/v1/datasets/default/documents",
                files={"file": ("a.txt", b"x")},
                data={"external_id": "a\x01b"},
            ),
            "two files": c.post(
                "/v1/datasets/default/documents",
                files=[("file", ("a.txt", b"x")), ("file", ("b.txt", b"y"))],
                data={"external_id": "two"},
            ),
            "conflict": c.post(
                "/v1/datasets/default/documents",
                files={"file": ("h.txt", NEW)},
                data={"external_id": "another"},
            ),
            "lookup": c.get("/v1/documents", params={"external_id": "a\x01"}),
            "unknown": c.delete("/v1/datasets/default/documents/by-external-id/nope"),
            "no dataset": c.delete("/v1/datasets/nope/documents/by-external-id/hb/1"),
        }
        codes = {k: (r.status_code, r.json().get("code")) for k, r in refusals.items()}
        assert codes == {
            "empty": (422, "bad_external_id"),
            "control": (422, "bad_external_id"),
            "two files": (422, "external_id_needs_one_file"),
            "conflict": (409, "external_id_conflict"),
            "lookup": (422, "bad_external_id"),
            "unknown": (404, codes["unknown"][1]),
            "no dataset": (404, codes["no dataset"][1]),
        }
        assert all(
            r.headers["content-type"].startswith("application/problem+json")
            for r in refusals.values()
        )
        done = c.delete("/v1/datasets/default/documents/by-external-id/hb/1")
        assert done.status_code == 200 and done.json()["jobs_deleted"], done.text
        assert c.get("/v1/documents", params={"external_id": "hb/1"}).json()["documents"] == []
    assert served(ctx) == set()


def test_the_cli_the_client_and_the_upload_page_take_external_ids(ctx, capsys, tmp_path):
    first, second = tmp_path / "handbook.txt", tmp_path / "other.txt"
    first.write_bytes(OLD)
    second.write_bytes(NEW)
    assert cli(["ingest", str(first), str(second), "--external-id", "hb"]) == 2
    assert "--external-id names one file" in capsys.readouterr().err
    assert cli(["ingest", str(first), "--external-id", "hb", "--json"]) == 0
    [made] = json.loads(capsys.readouterr().out)
    assert (made["external_id"], made["version"]) == ("hb", 1)
    run_job(made["job_id"], ctx=ctx)
    assert cli(["documents", "--external-id", "hb", "--json"]) == 0
    [shown] = json.loads(capsys.readouterr().out)
    assert (shown["document_id"], shown["message"]) == (made["document_id"], "version 1 (live)")
    assert cli(["documents", "--external-id", "a\x07"]) == 2
    assert cli(["documents", "--external-id", "nope"]) == 1
    capsys.readouterr()
    with InProcessApi() as api, Client(api.url, make_key("c", datasets=None, scope="manage")) as c:
        job = c.upload(NEW, filename="handbook.txt", external_id="hb")
        assert job["replaces_document_id"] == made["document_id"]
        [live] = c.documents(external_id="hb")
        assert live["version_message"] == "version 1 (live); version 2 (replacement) being built"
        with pytest.raises(ApiError) as missing:
            c.delete_by_external_id("no/such")
        assert missing.value.status == 404
    at = open_console("upload")
    at.get("file_uploader")[0].set_value([("handbook.txt", NEW + b" three", "text/plain")])
    at.text_input(key="upload_external_id").set_value("hb")
    at.button[0].click().run()
    assert_ok(at)
    assert "External id hb: version 3 is being built; version 1 still serving" in texts(at)
    assert cli(["documents", "--external-id", "hb", "--delete"]) == 0
    assert "deleted document" in capsys.readouterr().out
    assert find_by_external_id(ctx, "default", "hb") is None
