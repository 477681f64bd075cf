"""The blob store in an S3-compatible object store (SLUICE_BLOB_STORE=s3), against moto's server
mode started here as a separate process: uploads stream in and keep to the size limit, a real
worker ingests through it, an outage of the store is an outage (jobs wait, attempts unspent),
sharing between datasets survives deletes (also racing an upload of the same bytes), and
``sluice blobs migrate --to s3`` killed halfway finishes when run again."""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
import threading
from types import SimpleNamespace

import pytest
from sqlmodel import Session

from sluice import faults
from sluice.ops.documents import delete_document
from sluice.ops.ingest import ingest_bytes
from sluice.pipeline.reconcile.audit import reconcile
from sluice.storage.blobs import BlobTooLarge
from sluice.storage.models import Document
from sluice.storage.s3_blobs import S3BlobStore
from tests.support.helpers import Background, events, ids_of_job, job, until, wait_for
from tests.support.object_store import CREDENTIALS, MotoServer, TcpGate, new_bucket, objects

PREFIX = "sluice/"


def doc(i: int) -> bytes:
    return (f"Object store document {i} is about subject {i} in depth. " * 50 + "\n\n").encode() * 3


@pytest.fixture(scope="module")
def moto(tmp_path_factory):
    server = MotoServer(tmp_path_factory.mktemp("moto"))
    server.start()
    gate = TcpGate(server.port)  # Sluice talks to the store through it; a test may close it
    gate.open()
    yield SimpleNamespace(server=server, gate=gate)
    gate.close()
    server.stop()


@pytest.fixture
def s3(moto, monkeypatch):
    bucket = new_bucket(moto.server.url)
    env = {
        **CREDENTIALS,
        "SLUICE_BLOB_STORE": "s3",
        "SLUICE_S3_ENDPOINT_URL": moto.gate.url,
        "SLUICE_S3_BUCKET": bucket,
        "SLUICE_S3_PREFIX": PREFIX,
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    yield SimpleNamespace(bucket=bucket, url=moto.server.url, gate=moto.gate)
    moto.gate.open()  # the next test finds the store up


@pytest.fixture
def s3ctx(s3, make_ctx):
    return make_ctx()


def stored(s3) -> dict[str, int]:
    return objects(s3.url, s3.bucket, PREFIX)


def blob_key(ctx, document_id: int) -> str:
    with Session(ctx.engine) as session:
        return session.get(Document, document_id).blob_key


def local_files(ctx) -> list[str]:
    """Files Sluice left on this host's disk for blobs (the store, its scratch copies)."""
    roots = [ctx.settings.blob_dir, ctx.settings.data_dir / "blob-scratch"]
    return [str(p) for root in roots if root.exists() for p in root.rglob("*") if p.is_file()]


def test_uploads_stream_in_parts_and_the_limit_holds_while_they_arrive(s3, tmp_path):
    store = S3BlobStore(
        bucket=s3.bucket,
        prefix=PREFIX,
        endpoint_url=s3.gate.url,
        scratch=tmp_path / "scratch",
        part_size=5 * 1024 * 1024,
    )
    data = os.urandom(12 * 1024 * 1024 + 17)  # three parts
    key, size = store.put_stream(io.BytesIO(data), max_bytes=len(data))
    assert (key, size) == (hashlib.sha256(data).hexdigest(), len(data))
    assert stored(s3) == {PREFIX + key: len(data)}  # no staging object left
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    ).stdout.strip()
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    (scratch / f"fetch-{dead}-left").write_bytes(b"a copy a killed worker left")
    (scratch / f"fetch-{os.getpid()}-mine").write_bytes(b"a copy of a live process")
    with store.local_copy(key) as path:
        assert path.read_bytes() == data
    # the copy is gone after the block, and so is the dead process's; a live one's stays
    assert [p.name for p in scratch.iterdir()] == [f"fetch-{os.getpid()}-mine"]

    class Counting(io.BytesIO):
        read_bytes = 0

        def read(self, n=-1):
            block = super().read(n)
            Counting.read_bytes += len(block)
            return block

    big = Counting(os.urandom(30 * 1024 * 1024))
    with pytest.raises(BlobTooLarge):
        store.put_stream(big, max_bytes=11 * 1024 * 1024)
    assert Counting.read_bytes <= 12 * 1024 * 1024  # refused while streaming, not after
    assert stored(s3) == {PREFIX + key: len(data)}
    from tests.support.object_store import s3_client

    assert not s3_client(s3.url).list_multipart_uploads(Bucket=s3.bucket).get("Uploads")


def test_an_ingest_through_the_object_store_with_a_real_worker(s3ctx, s3, start_worker, samples):
    from sluice.pipeline.queueing.publishing import publish

    ctx = s3ctx
    start_worker()
    pdf = sorted(samples.glob("*.pdf"))[0].read_bytes()
    results = [
        ingest_bytes(ctx, doc(i), dataset="default", filename=f"d{i}.txt", publish=publish)
        for i in range(3)
    ] + [ingest_bytes(ctx, pdf, dataset="default", filename="sample.pdf", publish=publish)]
    assert all(r.accepted for r in results)

    done = wait_for(ctx, [r.job_id for r in results], timeout=120)

    assert [j.status.value for j in done] == ["succeeded"] * 4
    for j in done:
        assert len(ids_of_job(ctx, j.id)) == j.chunk_count > 0
    keys = {PREFIX + blob_key(ctx, r.document_id) for r in results}
    assert set(stored(s3)) == keys  # every blob in the store, no staging object left
    assert local_files(ctx) == []  # and none on this host's disk
    assert ctx.blobs.read(blob_key(ctx, results[-1].document_id)) == pdf
    report = reconcile(ctx)
    assert report.clean and report.blobs_checked == 4


@pytest.mark.slow
def test_the_object_store_stopped_during_a_run_costs_no_attempt(s3ctx, s3, start_worker):
    """The store goes away with jobs queued and stays away for many retry rounds: jobs wait,
    saying for what, the System page's probe and the metrics say it is down, an upload is refused
    with the outage's words; once it is back every job finishes on its first attempt."""
    from prometheus_client import generate_latest

    from sluice.ops import health
    from sluice.ops.metrics import registry
    from sluice.pipeline.queueing.publishing import publish

    ctx = s3ctx
    results = [
        ingest_bytes(ctx, doc(i), dataset="default", filename=f"d{i}.txt", publish=publish)
        for i in range(6)
    ]
    ids = [r.job_id for r in results]
    s3.gate.close()
    try:
        start_worker(env={"SLUICE_MAX_ATTEMPTS": "2"})
        until(
            lambda: min(sum(e.kind == "waiting" for e in events(ctx, i)) for i in ids) >= 4,
            timeout=90,
            what="every job waited four rounds",
        )
        during = {i: job(ctx, i) for i in ids}
        [probe] = [p for p in health.probes(ctx.settings) if p.name == "object store"]
        scraped = generate_latest(registry()).decode()
        refused = ingest_bytes(ctx, doc(99), dataset="default", filename="during.txt")
    finally:
        s3.gate.open()

    assert all(j.status.value in ("retrying", "running") for j in during.values())
    assert all(j.attempt == 0 for j in during.values() if j.status.value == "retrying")
    waiting = [j for j in during.values() if j.waiting_for]
    assert waiting and all(j.waiting_for.startswith("the object store (s3://") for j in waiting)
    assert not probe.reachable and "does not answer" in probe.detail
    assert 'sluice_up{service="object_store"} 0.0' in scraped
    assert not refused.accepted and refused.error_code == "blob_store_unavailable"

    done = wait_for(ctx, ids, timeout=120)
    assert [(j.status.value, j.attempt) for j in done] == [("succeeded", 1)] * 6
    [probe] = [p for p in health.probes(ctx.settings) if p.name == "object store"]
    assert probe.reachable
    assert 'sluice_up{service="object_store"} 1.0' in generate_latest(registry()).decode()


def test_a_blob_shared_by_two_datasets_stays_until_its_last_document_is_deleted(s3ctx, s3):
    ctx = s3ctx
    a = ingest_bytes(ctx, doc(1), dataset="alpha", filename="one.txt")
    b = ingest_bytes(ctx, doc(1), dataset="beta", filename="same-bytes.txt")
    key = blob_key(ctx, a.document_id)
    assert blob_key(ctx, b.document_id) == key and set(stored(s3)) == {PREFIX + key}

    first = delete_document(ctx, f"doc:{a.document_id}", actor="test")
    # the bytes stay for beta, but alpha's delete says nothing of beta's copy
    assert first.ok and first.blob_removed and "other document" not in first.message
    assert ctx.blobs.read(key) == doc(1)

    last = delete_document(ctx, f"doc:{b.document_id}", actor="test")
    assert last.ok and last.blob_removed
    assert stored(s3) == {}  # nothing left, nothing aside


@pytest.mark.parametrize("window", ["blob_unused", "blob_retired"])
def test_the_same_bytes_uploaded_to_two_datasets_while_they_are_deleted(s3ctx, s3, window):
    """A delete of the last document of some bytes, and two uploads of the same bytes to two
    other datasets at the same moment, forced into the delete's windows: after its first look
    at the blob's users (both uploads have stored their bytes and wait to insert their documents
    until the delete is over), and after it moved the blob aside (both uploads finish inside).
    Either way both new documents find their bytes."""
    ctx = s3ctx
    data = doc(7)
    old = ingest_bytes(ctx, data, dataset="gone", filename="old.txt")
    key = blob_key(ctx, old.document_id)
    arrived = threading.Barrier(3, timeout=30)
    deleted = threading.Event()
    results: dict[str, object] = {}

    def upload(dataset: str) -> None:
        results[dataset] = ingest_bytes(ctx, data, dataset=dataset, filename="again.txt")

    def at_insert(**info) -> None:  # the uploads: bytes stored, documents not yet inserted
        if window == "blob_unused" and info.get("sha256") == key:
            arrived.wait()
            assert deleted.wait(30)

    def in_delete(**info) -> None:
        if window == "blob_unused":
            arrived.wait()  # both uploads hold their bytes; the delete goes on
        else:
            threads = [threading.Thread(target=upload, args=(d,)) for d in ("one", "two")]
            for t in threads:
                t.start()
            for t in threads:
                t.join(30)

    with faults.hook("before_document_insert", at_insert), faults.hook(window, in_delete):
        uploads = []
        if window == "blob_unused":
            uploads = [Background(lambda d=d: upload(d)) for d in ("one", "two")]
            for u in uploads:
                u.start()
        result = delete_document(ctx, f"doc:{old.document_id}", actor="test")
        deleted.set()
        for u in uploads:
            u.result()

    # blob_unused: the delete removed the blob and the uploads put their bytes back;
    # blob_retired: the delete saw the new documents and put the blob back itself.
    assert result.ok and result.blob_removed == (window == "blob_unused")
    assert {d: r.accepted for d, r in results.items()} == {"one": True, "two": True}
    for r in results.values():
        assert blob_key(ctx, r.document_id) == key
    assert ctx.blobs.read(key) == data
    assert set(stored(s3)) == {PREFIX + key}  # the uploads' and the delete's copies are gone
    assert reconcile(ctx).blobs_missing_count == 0


def test_blobs_migrate_killed_halfway_and_run_again(make_ctx, s3, monkeypatch):
    """A local store of five blobs moved to the object store by `sluice blobs migrate --to s3`;
    the first run dies (kill -9 at a fault point) after the third blob was sent and before its
    local file was removed; the second run finishes the move; a third changes nothing."""
    monkeypatch.setenv("SLUICE_BLOB_STORE", "local")
    local = make_ctx()
    results = [
        ingest_bytes(local, doc(i), dataset="default", filename=f"m{i}.txt") for i in range(5)
    ]
    keys = sorted(blob_key(local, r.document_id) for r in results)
    assert sorted(local.blobs.keys()) == keys and stored(s3) == {}

    def migrate(**env: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "sluice.cli", "blobs", "migrate", "--to", "s3"],
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=120,
        )

    killed = migrate(SLUICE_FAULTS="blob_migrated@3=exit")
    assert killed.returncode != 0
    assert len(stored(s3)) == 3 and len(list(local.blobs.keys())) == 3  # 2 moved, 1 sent, 2 left

    again = migrate()
    assert again.returncode == 0, again.stderr
    assert "2 sent" in again.stdout and "1 already there" in again.stdout
    assert "3 removed" in again.stdout
    assert sorted(stored(s3)) == [PREFIX + k for k in keys] and list(local.blobs.keys()) == []

    third = migrate()
    assert third.returncode == 0 and "0 sent" in third.stdout and "0 removed" in third.stdout

    monkeypatch.setenv("SLUICE_BLOB_STORE", "s3")
    ctx = make_ctx()
    assert all(
        ctx.blobs.read(blob_key(ctx, r.document_id)) == doc(i) for i, r in enumerate(results)
    )
    assert reconcile(ctx).blobs_missing_count == 0

    from tests.support.object_store import s3_client

    s3_client(s3.url).delete_object(Bucket=s3.bucket, Key=PREFIX + keys[0])
    report = reconcile(ctx)
    assert report.blobs_missing_count == 1 and not report.clean
    assert report.blobs_missing[0]["blob"] == keys[0]
    assert "no uploaded file in the blob store" in report.describe()


KILLED_UPLOAD = """
import io, os, sys
from sluice.storage.s3_blobs import S3BlobStore

store = S3BlobStore(bucket=sys.argv[1], prefix=sys.argv[2], endpoint_url=sys.argv[3],
                    scratch=sys.argv[4], part_size=5 * 1024 * 1024)
store.receive(io.BytesIO(b"staged, its document never committed"), max_bytes=1 << 20)


class DiesInTheSecondPart(io.BytesIO):
    def read(self, n=-1):
        if self.tell() >= 5 * 1024 * 1024:
            os._exit(9)  # killed with one part sent
        return super().read(n)


store.receive(DiesInTheSecondPart(os.urandom(6 * 1024 * 1024)), max_bytes=1 << 30)
"""


def killed_upload(s3, tmp_path) -> None:
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_UPLOAD, s3.bucket, PREFIX, s3.gate.url, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert killed.returncode == 9, killed.stderr


def test_the_sweep_removes_what_a_killed_upload_left_and_never_a_younger_one(s3ctx, s3, tmp_path):
    """A process killed in its uploads leaves a staged object and an unfinished multipart upload
    under tmp/ (and a removal killed between its moves leaves a retired blob, whose key then has
    no object); `sluice blobs sweep` removes the ones older than the bound, putting the retired
    blob back first, and leaves alone the staging object and multipart upload of an upload that
    is still running."""
    import json
    import math
    import time

    from sluice.ops.access import cli_operator
    from sluice.ops.blob_migration import sweep_leftovers
    from tests.support.object_store import s3_client

    operator = cli_operator()

    store = S3BlobStore(
        bucket=s3.bucket,
        prefix=PREFIX,
        endpoint_url=s3.gate.url,
        scratch=tmp_path / "scratch",
        part_size=5 * 1024 * 1024,
    )
    client = s3_client(s3.url)
    kept, _ = store.put_bytes(doc(3), max_bytes=1 << 20)
    assert store.retire(kept) is not None  # and the removal dies here
    killed_upload(s3, tmp_path)
    left = stored(s3)
    assert len([k for k in left if k.startswith(PREFIX + "tmp/upload-")]) == 1
    assert [k for k in left if k.startswith(PREFIX + "tmp/retired-")] and PREFIX + kept not in left
    assert len(client.list_multipart_uploads(Bucket=s3.bucket)["Uploads"]) == 1

    # The store's times are whole seconds: the running upload begins in a later second.
    later = math.floor(time.time()) + 1.01
    until(lambda: time.time() >= later, timeout=2, what="the next second")
    mark = time.time()  # the bound: between the killed upload and the running one
    assert s3ctx.blobs.client is not None
    until(lambda: time.time() >= mark + 0.5, timeout=2, what="half a second after the bound")
    running = store.receive(io.BytesIO(b"an upload still in progress"), max_bytes=1 << 20)
    part_sent, go_on = threading.Event(), threading.Event()

    class Slow(io.BytesIO):
        def read(self, n=-1):
            if self.tell() >= 5 * 1024 * 1024:
                part_sent.set()
                assert go_on.wait(30)
            return super().read(n)

    big = os.urandom(6 * 1024 * 1024)
    multipart = Background(lambda: store.receive(Slow(big), max_bytes=1 << 30))
    multipart.start()
    assert part_sent.wait(30)
    try:
        daily = subprocess.run(  # the bound of a day: nothing here is that old
            [sys.executable, "-m", "sluice.cli", "blobs", "sweep", "--json"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        swept = sweep_leftovers(s3ctx, operator, older_than_seconds=time.time() - mark - 0.25)
        uploads = client.list_multipart_uploads(Bucket=s3.bucket).get("Uploads", [])
    finally:
        go_on.set()
    assert daily.returncode == 0, daily.stderr
    assert json.loads(daily.stdout)["removed"] == 0 and json.loads(daily.stdout)["kept_young"] == 5
    assert (swept.staged, swept.multipart, swept.retired, swept.restored) == (1, 1, 1, 1)
    assert swept.kept_young == 2
    assert len(uploads) == 1  # the running one's, not aborted
    done = multipart.result()
    store.keep(running.key, running.held)
    store.keep(done.key, done.held)
    orphan = hashlib.sha256(b"staged, its document never committed").hexdigest()
    # nothing left under tmp/: the blobs, and the killed upload's (its bytes reached their key)
    assert set(stored(s3)) == {PREFIX + k for k in (kept, running.key, done.key, orphan)}
    assert store.read(kept) == doc(3) and store.read(done.key) == big
    assert not client.list_multipart_uploads(Bucket=s3.bucket).get("Uploads")


def test_an_api_upload_while_the_object_store_is_down_is_a_503_with_retry_after(s3ctx, s3):
    """Through the HTTP API: 503 problem+json ``blob_store_unavailable`` with Retry-After, nothing
    stored and no job made; the same request once the store is back is accepted."""
    import httpx

    from sluice.storage.models import Job
    from tests.support.api_server import InProcessApi, auth, make_key

    token = make_key("outage", datasets=["default"], scope="ingest")
    body = {"filename": "during.txt", "text": doc(5).decode()}
    with InProcessApi() as api:
        url = f"{api.url}/v1/datasets/default/documents"
        s3.gate.close()
        try:
            refused = httpx.post(url, json=body, headers=auth(token), timeout=60)
        finally:
            s3.gate.open()
        with Session(s3ctx.engine) as session:
            jobs_made = session.query(Job).count()
        objects_left = stored(s3)
        again = httpx.post(url, json=body, headers=auth(token), timeout=60)

    assert refused.status_code == 503
    assert refused.headers["content-type"].startswith("application/problem+json")
    assert refused.json()["code"] == "blob_store_unavailable"
    assert int(refused.headers["Retry-After"]) > 0
    assert "object store" in refused.json()["detail"]
    assert jobs_made == 0 and objects_left == {}
    assert again.status_code == 202 and again.json()["jobs"][0]["job_id"] > 0
