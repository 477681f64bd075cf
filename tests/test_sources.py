"""Sources that stay in sync (sluice.ops.sources), on a real folder and on the S3-protocol test
server: additions, changes, renames and removals happen exactly; renames embed nothing; removed
documents leave search at once and are gone after the tombstone time; an empty or failed listing
removes nothing; a sync killed halfway converges when run again; two syncs at once run once; a
file changed while it is read is indexed with its final bytes; and a sync does exactly what its
preview's plan says, for any listing and any state its syncs recorded."""

from __future__ import annotations

import hashlib
import itertools
import os
import shutil
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st
from sqlalchemy import update
from sqlmodel import Session, col, select

from sluice import faults
from sluice.ops.search import search
from sluice.ops.sources import listing, previewing, syncing
from sluice.ops.sources.listing import Seen
from sluice.ops.sources.plan import ADD, CHANGE, RENAME, RESTORE, TOUCH, Known, Step, make_plan
from sluice.pipeline.running.runner import run_job
from sluice.storage import source_records
from sluice.storage.clock import db_now
from sluice.storage.models import Document, Job, JobStatus
from sluice.storage.source_records import Source, SourceEntry, SourceLease, SourceRun
from tests.support.object_store import CREDENTIALS, MotoServer, TcpGate, new_bucket, s3_client

ROOT = Path(__file__).resolve().parent.parent


def body(i: int, v: int = 0) -> bytes:
    """File ``i`` in version ``v``: its own words (zq<i>v<v>), a size that changes with ``v``."""
    word = f"zq{i}v{v}"
    return (f"Source file {i} talks about {word} and nothing else. " * (20 + v) + "\n").encode()


def run_pending(ctx) -> int:
    with Session(ctx.engine) as session:
        ids = session.exec(
            select(Job.id).where(col(Job.status).in_([JobStatus.pending, JobStatus.retrying]))
        ).all()
    for job_id in ids:
        run_job(job_id, ctx=ctx)
    return len(ids)


def found(ctx, word: str, dataset: str = "docs") -> set[str]:
    return {h.filename for h in search(ctx, query=word, dataset=dataset, k=5, mode="lexical")}


def job_count(ctx) -> int:
    with Session(ctx.engine) as session:
        return len(session.exec(select(Job.id)).all())


class FolderSide:
    kind = "folder"

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def put(self, name: str, data: bytes) -> None:
        path = self.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)

    def rename(self, old: str, new: str) -> None:
        (self.root / new).parent.mkdir(parents=True, exist_ok=True)
        os.rename(self.root / old, self.root / new)

    def delete(self, name: str) -> None:
        (self.root / name).unlink()

    def add_source(self, ctx, name: str = "src") -> None:
        syncing.add_source(ctx, name=name, dataset="docs", folder=str(self.root))


class S3Side:
    kind = "s3"

    def __init__(self, moto, bucket: str) -> None:
        self.client = s3_client(moto.server.url)
        self.bucket = bucket

    def put(self, name: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.bucket, Key=f"team/{name}", Body=data)

    def rename(self, old: str, new: str) -> None:
        src = {"Bucket": self.bucket, "Key": f"team/{old}"}
        self.client.copy_object(Bucket=self.bucket, Key=f"team/{new}", CopySource=src)
        self.delete(old)

    def delete(self, name: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=f"team/{name}")

    def add_source(self, ctx, name: str = "src") -> None:
        syncing.add_source(ctx, name=name, dataset="docs", s3=f"s3://{self.bucket}/team")


@pytest.fixture(scope="module")
def moto(tmp_path_factory):
    server = MotoServer(tmp_path_factory.mktemp("moto"))
    server.start()
    gate = TcpGate(server.port)
    gate.open()
    yield SimpleNamespace(server=server, gate=gate)
    gate.close()
    server.stop()


@pytest.fixture
def s3side(moto, monkeypatch):
    for key, value in {**CREDENTIALS, "SLUICE_S3_ENDPOINT_URL": moto.gate.url}.items():
        monkeypatch.setenv(key, value)
    yield S3Side(moto, new_bucket(moto.server.url))
    moto.gate.open()


@pytest.fixture(params=["folder", "s3"])
def side(request, tmp_path):
    if request.param == "folder":
        return FolderSide(tmp_path / "share")
    return request.getfixturevalue("s3side")


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def reads(contents: dict[str, bytes], files: dict[str, Seen]):
    """A ``read`` for ``make_plan``: the bytes of ``contents``; any other path cannot be read."""

    def read(path: str) -> tuple[bytes, Seen]:
        if path not in contents:
            raise OSError(f"{path}: permission denied")
        return contents[path], files[path]

    return read


def test_the_plan_is_a_pure_function_of_the_listing_and_what_is_known():
    known = {f"f{i}": Known(f"f{i}", 10, 1, sha(b"v%d" % i), i) for i in range(10)}
    files = {f"f{i}": Seen(10, 1) for i in range(10)}
    files["f1"] = Seen(11, 2)  # changed
    files["g2"] = files.pop("f2")  # renamed: same bytes
    del files["f3"]
    files["new"] = Seen(5, 5)
    files["locked"] = Seen(5, 5)  # cannot be read: left out, in failed
    contents = {"f1": b"other", "g2": b"v2", "new": b"N"}
    plan = make_plan(files, known, reads(contents, files))
    assert plan.steps == [
        Step(CHANGE, "f1", sha(b"other"), Seen(11, 2)),
        Step(RENAME, "g2", sha(b"v2"), Seen(10, 1), old="f2"),
        Step(ADD, "new", sha(b"N"), Seen(5, 5)),
    ]
    assert (plan.add, plan.change, plan.rename, plan.remove) == (
        ["new"],
        ["f1"],
        [("f2", "g2")],
        ["f3"],
    )
    assert plan.unchanged == 7
    assert plan.failed == [{"path": "locked", "error": "locked: permission denied"}]
    nothing = reads({}, {})
    held = make_plan({}, known, nothing)
    assert held.remove == [] and len(held.held) == 10 and "empty" in held.held_reason
    failed = make_plan({}, known, nothing, error="ConnectionError", confirmed=True)
    assert failed.remove == [] and "listing failed" in failed.held_reason
    many = make_plan({f"f{i}": Seen(10, 1) for i in range(6)}, known, nothing)
    assert many.remove == [] and len(many.held) == 4 and "30%" in many.held_reason
    assert make_plan({}, known, nothing, confirmed=True).remove == sorted(known)

    # each step goes to carry_out as it is planned; one refused is a failure, not done
    handed: list[Step] = []

    def carry_out(step: Step, data: bytes) -> str | None:
        handed.append(step)
        return "refused" if step.path == "new" else None

    refused = make_plan(files, known, reads(contents, files), carry_out=carry_out)
    assert handed == plan.steps == refused.steps and refused.add == []
    assert (refused.counts()["added"], refused.counts()["failed"]) == (0, 2)


# The drift test's world: a few paths; bytes of two sizes (a same-size edit at the same time is
# "unchanged": not read); two modification times.
PATHS = ("a.txt", "b.txt", "d/c.txt", "d/e.txt", "f.txt")
TEXTS = (body(0), body(1), body(2), body(3, 1))
TIMES = (1_600_000_000 * 10**9, 1_700_000_000 * 10**9)
KNOWN = st.none() | st.tuples(st.integers(0, 3), st.integers(0, 1), st.booleans())  # tombstone?
LISTED = st.none() | st.tuples(st.integers(0, 3), st.integers(0, 1))
STATES = st.tuples(*[st.tuples(KNOWN, LISTED) for _ in PATHS])
RENAME_ONTO_A_TOMBSTONE = (  # and a touch, a change, an addition, a same-size edit unseen
    ((0, 0, False), None),
    ((1, 0, True), (0, 1)),
    ((2, 0, False), (2, 1)),
    ((1, 0, False), (3, 0)),
    (None, (1, 0)),
)
RESTORE_AND_MASS_REMOVAL = (
    ((0, 0, True), (0, 1)),
    ((1, 0, False), None),
    ((2, 0, False), None),
    ((1, 1, False), (1, 1)),
    ((0, 0, False), (0, 0)),
)


def _entries(ctx, source_id: int) -> dict[str, SourceEntry]:
    with Session(ctx.engine) as session:
        rows = session.exec(select(SourceEntry).where(SourceEntry.source_id == source_id))
        return {e.path: e for e in rows}


def _expected(before: dict[str, SourceEntry], plan, refused: set[str]) -> dict[str, tuple]:
    """The entries a sync that carries out ``plan`` leaves (but the steps ingest ``refused``):
    path -> (live, sha256, size, time, whose document it names: its path before, or "new")."""
    out = {p: (e.removed_at is None, e.sha256, e.size, e.mtime_ns, p) for p, e in before.items()}
    for step in plan.steps:
        if step.path in refused:
            continue
        if step.action == RENAME:
            origin = out.pop(step.old)[4]
        elif step.action in (TOUCH, RESTORE):
            origin = out[step.path][4]
        else:
            origin = "new"
        out[step.path] = (True, step.sha256, step.seen.size, step.seen.mtime_ns, origin)
    for path in plan.remove:
        out[path] = (False, *out[path][1:])
    return out


def _observed(before: dict[str, SourceEntry], after: dict[str, SourceEntry]) -> dict[str, tuple]:
    whose = {e.document_id: p for p, e in before.items()}
    return {
        p: (e.removed_at is None, e.sha256, e.size, e.mtime_ns, whose.get(e.document_id, "new"))
        for p, e in after.items()
    }


def _folder_source(ctx, root: Path, name: str, states) -> int:
    """A folder source over ``root`` holding the listed side of ``states``, its entries the known
    side (each naming a document of its own, in no table); its id."""
    root.mkdir()
    for path, (_, listed) in zip(PATHS, states, strict=True):
        if listed is not None:
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            (root / path).write_bytes(TEXTS[listed[0]])
            os.utime(root / path, ns=(TIMES[listed[1]], TIMES[listed[1]]))
    syncing.add_source(ctx, name=name, dataset=name, folder=str(root))
    with Session(ctx.engine) as session:
        src = source_records.by_name(session, name)
        assert src is not None
        now = db_now(session)
        src.unconfirmed_since = None  # synced before (its entries below)
        session.add(src)
        for i, (path, (known, _)) in enumerate(zip(PATHS, states, strict=True)):
            if known is not None:
                text, at, removed = known
                entry = SourceEntry(
                    source_id=src.id,
                    path=path,
                    size=len(TEXTS[text]),
                    mtime_ns=TIMES[at],
                    sha256=sha(TEXTS[text]),
                    document_id=10**6 + 10 * src.id + i,
                    removed_at=now if removed else None,
                )
                session.add(entry)
        session.commit()
        return src.id


def test_a_sync_does_exactly_what_its_preview_plans(tmp_path, make_ctx):
    """For any listing of a folder and any entries its syncs recorded (live or tombstoned), with or
    without confirmation, and a listing that fails: what the sync does, file by file (the entries it
    leaves), is the plan the preview shows, and their counts are the same."""
    ctx = make_ctx()
    numbers = itertools.count()

    @settings(
        max_examples=25,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
        phases=[Phase.explicit, Phase.generate],  # an example costs a sync: no slow shrinking
    )
    @given(states=STATES, confirm=st.booleans(), broken=st.sampled_from([False] * 5 + [True]))
    @example(states=RENAME_ONTO_A_TOMBSTONE, confirm=False, broken=False)
    @example(states=RESTORE_AND_MASS_REMOVAL, confirm=False, broken=False)  # held
    @example(states=RESTORE_AND_MASS_REMOVAL, confirm=True, broken=False)  # removed
    @example(states=RESTORE_AND_MASS_REMOVAL, confirm=True, broken=True)  # a failed listing
    def check(states, confirm: bool, broken: bool) -> None:
        name = f"p{next(numbers)}"
        source_id = _folder_source(ctx, tmp_path / name, name, states)
        if broken:
            shutil.rmtree(tmp_path / name)
        before = _entries(ctx, source_id)
        with Session(ctx.engine) as session:
            src = source_records.by_name(session, name)
        assert src is not None
        planned = previewing.plan_source(ctx, src, confirm=confirm)  # what preview_sync shows
        shown = syncing.sync(ctx, name, preview=True, confirm=confirm)
        done = syncing.sync(ctx, name, actor="test", confirm=confirm)
        assert shown.counts == planned.counts() and planned.failed == []
        # no preview sees what ingest refuses (the same bytes under two new paths, in one dataset)
        refused = {f["path"] for f in done.failed}
        assert refused <= {s.path for s in planned.steps if s.action in (ADD, CHANGE)}
        after = _entries(ctx, source_id)
        assert _observed(before, after) == _expected(before, planned, refused), done.message
        planned.failed = done.failed
        assert done.counts == planned.counts(), done.message
        assert done.held_reason == shown.held_reason == planned.held_reason
        assert done.status == ("failed" if planned.error else "held" if planned.held else "done")

    check()


def test_edits_renames_deletes_and_an_addition_happen_exactly(side, make_ctx):
    ctx = make_ctx()
    for i in range(20):
        side.put(f"d{i // 10}/f{i}.txt", body(i))
    side.add_source(ctx)
    first = syncing.sync(ctx, "src", actor="test", confirm=True)
    assert first.status == "done", first.message
    assert first.counts["added"] == 20 and run_pending(ctx) == 20
    assert found(ctx, "zq7v0") == {"f7.txt"}

    for i in (0, 1, 2):
        side.put(f"d0/f{i}.txt", body(i, 1))
    side.rename("d0/f3.txt", "moved/g3.txt")
    side.rename("d1/f14.txt", "moved/g14.txt")
    for i in (5, 6, 15, 16):
        side.delete(f"d{i // 10}/f{i}.txt")
    side.put("d1/new.txt", body(99))
    jobs_before = job_count(ctx)
    preview = syncing.sync(ctx, "src", preview=True)
    assert preview.ran is False and "to embed" in preview.cost
    assert job_count(ctx) == jobs_before  # a preview changes nothing

    second = syncing.sync(ctx, "src", actor="test")
    c = second.counts
    assert (c["added"], c["changed"], c["renamed"], c["removed"]) == (1, 3, 2, 4), second.message
    assert c["unchanged"] == 20 - 3 - 2 - 4 and c["failed"] == 0
    assert job_count(ctx) == jobs_before + 4  # the renames made no job: nothing embedded
    for i in (5, 6, 15, 16):  # out of search at once, before any job runs
        assert found(ctx, f"zq{i}v0") == set()
    assert found(ctx, "zq3v0") == {"g3.txt"} and found(ctx, "zq14v0") == {"g14.txt"}
    run_pending(ctx)
    assert found(ctx, "zq1v1") == {"f1.txt"} and found(ctx, "zq1v0") == set()
    assert found(ctx, "zq99v0") == {"new.txt"}
    third = syncing.sync(ctx, "src", actor="test")
    assert third.counts["unchanged"] == 17 and third.counts["added"] == 0

    with Session(ctx.engine) as session:  # tombstoned: bytes and jobs kept for now
        gone = session.exec(select(Document).where(col(Document.deleted_at).is_not(None))).all()
        tomb = [d for d in gone if d.filename in {"f5.txt", "f6.txt", "f15.txt", "f16.txt"}]
    assert len(tomb) == 4 and all(ctx.blobs.exists(d.sha256) for d in tomb)
    assert syncing.purge_expired(ctx) == 0
    ctx = make_ctx(SLUICE_SYNC_TOMBSTONE_HOURS="0")  # the tombstone time has passed
    assert syncing.purge_expired(ctx) == 4
    with Session(ctx.engine) as session:
        statuses = {
            session.get(Job, d.active_job_id).status if d.active_job_id else None for d in tomb
        }
        for d in tomb:
            assert session.exec(select(Job).where(Job.document_id == d.id)).all()
            assert all(
                j.status == JobStatus.deleted
                for j in session.exec(select(Job).where(Job.document_id == d.id)).all()
            )
    assert statuses <= {None, JobStatus.deleted}


def test_an_emptied_folder_and_a_failed_listing_remove_nothing(tmp_path, make_ctx):
    ctx = make_ctx()
    share = FolderSide(tmp_path / "share")
    for i in range(5):
        share.put(f"f{i}.txt", body(i))
    share.add_source(ctx)
    syncing.sync(ctx, "src", confirm=True)
    run_pending(ctx)
    for i in range(5):
        share.delete(f"f{i}.txt")
    empty = syncing.sync(ctx, "src")
    assert empty.status == "held" and empty.counts["removed"] == 0 and empty.counts["held"] == 5
    assert "empty" in empty.held_reason and found(ctx, "zq2v0") == {"f2.txt"}
    share.root.rename(tmp_path / "elsewhere")  # the folder is gone: the listing fails
    failed = syncing.sync(ctx, "src", confirm=True)
    assert failed.status == "failed" and failed.counts["removed"] == 0
    assert "listing failed" in failed.held_reason and found(ctx, "zq2v0") == {"f2.txt"}
    (tmp_path / "elsewhere").rename(share.root)
    confirmed = syncing.sync(ctx, "src", confirm=True)  # an operator says the folder is empty
    assert confirmed.counts["removed"] == 5 and found(ctx, "zq2v0") == set()
    assert "5 tombstoned" in syncing.undo(ctx, "src")
    jobs_before = job_count(ctx)
    assert found(ctx, "zq2v0") == {"f2.txt"} and job_count(ctx) == jobs_before  # not embedded


def test_a_failed_s3_listing_removes_nothing(s3side, moto, make_ctx):
    ctx = make_ctx()
    for i in range(4):
        s3side.put(f"f{i}.txt", body(i))
    s3side.add_source(ctx)
    assert syncing.sync(ctx, "src", confirm=True).counts["added"] == 4
    moto.gate.close()
    failed = syncing.sync(ctx, "src", confirm=True)
    assert failed.status == "failed" and failed.counts["removed"] == 0
    with Session(ctx.engine) as session:
        entries = session.exec(select(SourceEntry)).all()
    assert len(entries) == 4 and all(e.removed_at is None for e in entries)


@pytest.mark.slow  # a killed process
def test_an_s3_edit_of_the_same_size_in_the_same_second_is_seen_by_its_etag(
    s3side, make_ctx, monkeypatch
):
    """S3 gives modification times to the second: an edit that keeps the size and lands in the
    same second as the version before looks unchanged by size and time. Its ETag moved."""

    monkeypatch.setattr(listing, "_ns", lambda when: 1_700_000_000 * 10**9)  # one second
    ctx = make_ctx()
    s3side.put("a.txt", body(1).replace(b"zq1v0", b"zq1aa"))
    s3side.add_source(ctx)
    first = syncing.sync(ctx, "src", actor="test", confirm=True)
    assert first.counts["added"] == 1 and run_pending(ctx) == 1
    assert found(ctx, "zq1aa") == {"a.txt"}
    s3side.put("a.txt", body(1).replace(b"zq1v0", b"zq1bb"))  # the same size, other words
    again = syncing.sync(ctx, "src", actor="test")
    assert again.counts["changed"] == 1, again.message
    assert run_pending(ctx) == 1
    assert found(ctx, "zq1bb") == {"a.txt"} and found(ctx, "zq1aa") == set()
    assert syncing.sync(ctx, "src", actor="test").counts["unchanged"] == 1  # and no re-read


def test_a_sync_killed_halfway_converges_when_run_again(tmp_path, make_ctx, sluice_env):
    ctx = make_ctx()
    share = FolderSide(tmp_path / "share")
    for i in range(12):
        share.put(f"f{i:02}.txt", body(i))
    share.add_source(ctx)
    killed = subprocess.run(
        [sys.executable, "-m", "sluice.cli", "sync", "src", "--yes"],
        env={**os.environ, "SLUICE_FAULTS": "source_applied@5=exit"},
        cwd=ROOT,
        capture_output=True,
        timeout=120,
    )
    assert killed.returncode == 137, killed.stderr.decode()[-2000:]
    with Session(ctx.engine) as session:
        assert len(session.exec(select(SourceEntry)).all()) == 5
    assert syncing.sync(ctx, "src").status == "busy"  # the dead holder's lease still runs
    with Session(ctx.engine) as session:  # ... until it expires
        session.execute(update(SourceLease).values(expires_at=datetime(2000, 1, 1, tzinfo=UTC)))
        session.commit()
    again = syncing.sync(ctx, "src")
    assert again.status == "done" and again.counts["added"] == 7, again.message
    with Session(ctx.engine) as session:
        docs = session.exec(select(Document)).all()
        runs = session.exec(select(SourceRun).order_by(col(SourceRun.id))).all()
    assert len(docs) == 12 and len({d.sha256 for d in docs}) == 12  # no duplicate
    assert [r.status for r in runs] == ["interrupted", "done"]


def test_two_syncs_of_one_source_at_once_run_once(database_url, tmp_path, make_ctx):
    ctx = make_ctx()
    share = FolderSide(tmp_path / "share")
    for i in range(3):
        share.put(f"f{i}.txt", body(i))
    share.add_source(ctx)
    results: dict[str, syncing.SyncResult] = {}
    errors: list[BaseException] = []
    second_done = threading.Event()

    def hold(**info) -> None:  # the first sync has the lease and listed: the second one comes now
        if threading.current_thread().name == "first":
            assert second_done.wait(30), "the second sync never returned"

    def run(name: str) -> None:
        try:
            results[name] = syncing.sync(ctx, "src", actor=name, confirm=True)
        except BaseException as exc:
            errors.append(exc)
        finally:
            if name == "second":
                second_done.set()

    with faults.hook("source_listed", hold):
        first = threading.Thread(target=run, args=("first",), name="first")
        first.start()
        with Session(ctx.engine) as session:  # wait until the first holds the lease (bounded)
            for _ in range(300):
                if session.get(SourceLease, 1, populate_existing=True) is not None:
                    break
                threading.Event().wait(0.05)
        second = threading.Thread(target=run, args=("second",), name="second")
        second.start()
        second.join(60)
        first.join(60)
    assert not errors, errors
    assert results["second"].status == "busy" and results["first"].counts["added"] == 3
    with Session(ctx.engine) as session:
        assert len(session.exec(select(SourceRun)).all()) == 1


def test_a_file_changed_while_it_is_read_is_indexed_with_its_final_bytes(
    database_url, tmp_path, make_ctx
):
    ctx = make_ctx()
    share = FolderSide(tmp_path / "share")
    share.put("f1.txt", body(1))
    share.add_source(ctx)
    final = body(1, 5)
    changed: list[str] = []

    def rewrite(path: str, **info) -> None:  # between the stat and the read
        if not changed:
            changed.append(path)
            share.put(path, final)

    with faults.hook("source_before_read", rewrite):
        result = syncing.sync(ctx, "src", confirm=True)
    assert changed == ["f1.txt"] and result.counts["added"] == 1
    with Session(ctx.engine) as session:
        entry = session.exec(select(SourceEntry)).one()
    st = (share.root / "f1.txt").stat()
    assert entry.sha256 == hashlib.sha256(final).hexdigest()
    assert (entry.size, entry.mtime_ns) == (st.st_size, st.st_mtime_ns)
    run_pending(ctx)
    assert found(ctx, "zq1v5") == {"f1.txt"} and found(ctx, "zq1v0") == set()
    assert syncing.sync(ctx, "src").counts["unchanged"] == 1  # nothing read again


def test_a_sync_is_a_recorded_run_with_a_webhook_and_metrics(tmp_path, make_ctx):
    import json

    from prometheus_client import generate_latest

    from sluice.ops.metrics import registry
    from sluice.storage.models import WebhookDelivery

    ctx = make_ctx(
        SLUICE_WEBHOOK_URLS="https://hooks.example/sluice", SLUICE_WEBHOOK_SECRET="s" * 40
    )
    share = FolderSide(tmp_path / "share")
    for i in range(3):
        share.put(f"f{i}.txt", body(i))
    share.add_source(ctx)
    result = syncing.sync(ctx, "src", actor="test", confirm=True)
    with Session(ctx.engine) as session:
        run = session.get(SourceRun, result.run_id)
        [hook] = session.exec(select(WebhookDelivery)).all()
    assert (run.status, run.added, run.actor) == ("done", 3, "test")
    sent = json.loads(hook.body)
    assert hook.event == "source.synced" and sent["run"]["added"] == 3
    assert sent["source"] == {"name": "src", "kind": "folder", "dataset": "docs"}
    text = generate_latest(registry()).decode()
    assert 'sluice_source_last_sync_files{change="added",source="src"} 3.0' in text
    assert 'sluice_source_documents{dataset="docs",source="src"} 3.0' in text


def test_the_workers_follow_a_source_on_schedule_and_as_its_folder_changes(tmp_path, make_ctx):
    from sluice.ops.sources import follow
    from sluice.pipeline.queueing import recovery
    from tests.support.helpers import until

    ctx = make_ctx()
    share = FolderSide(tmp_path / "share")
    share.put("f0.txt", body(0))
    syncing.add_source(ctx, name="src", dataset="docs", folder=str(share.root), every="1m")
    try:
        rounds = [follow.follow_round]
        assert (
            recovery.run_extra_rounds(ctx, rounds) == []
        )  # not before its first sync is confirmed
        assert "src" not in follow._watching and syncing.get_source(ctx, "src").documents == 0
        with Session(ctx.engine) as session:  # the confirmed first sync ran a minute ago
            session.execute(update(Source).values(unconfirmed_since=None, next_run_at=None))
            session.commit()
        assert recovery.run_extra_rounds(ctx, rounds) == ["sources: started src"]  # due at once
        follow._running["src"].join(60)
        assert syncing.get_source(ctx, "src").documents == 1
        assert recovery.run_extra_rounds(ctx, rounds) == []  # the next one is a minute away
        until(lambda: "src" in follow._watching, timeout=10, what="the folder watch")
        written: list[float] = []

        def synced() -> bool:  # the watch (debounced) syncs a new file, no round needed
            if not written or time.monotonic() - written[-1] > 3:  # until the watch is set up
                share.put(f"f{len(written) + 1}.txt", body(len(written) + 1))
                written.append(time.monotonic())
            return syncing.get_source(ctx, "src").documents > 1

        until(synced, timeout=30, what="a new file of the watched folder synced")
    finally:
        follow.stop_watching()
    assert not follow.errors


def test_the_api_manages_s3_sources_for_manage_keys_of_their_dataset(s3side, ctx, monkeypatch):
    import httpx

    from sluice.ops import actions
    from sluice.ops.access import cli_operator
    from sluice.settings import reset_settings_cache
    from tests.support.api_server import InProcessApi, auth, make_key

    monkeypatch.setenv("SLUICE_API_SOURCE_S3_ALLOWED", f"{s3side.bucket}/team")
    reset_settings_cache()

    for name in ("docs", "other"):
        assert actions.create_dataset(cli_operator(), name)[0]
    manage = auth(make_key("m", datasets=["docs"], scope="manage"))
    stranger = auth(make_key("o", datasets=["other"], scope="manage"))
    reader = auth(make_key("r", datasets=["docs"], scope="read"))
    for i in range(3):
        s3side.put(f"f{i}.txt", body(i))
    new = {"name": "team", "dataset": "docs", "s3": f"s3://{s3side.bucket}/team", "every": "1h"}
    with InProcessApi() as api, httpx.Client(base_url=api.url, timeout=30) as client:
        made = client.post("/v1/sources", json=new, headers=manage)
        assert made.status_code == 201, made.text
        assert made.json()["every_seconds"] == 3600
        assert client.post("/v1/sources", json=new, headers=manage).status_code == 409
        folder = {**new, "name": "f", "s3": "s3://b/p", "folder": "/etc"}
        assert client.post("/v1/sources", json=folder, headers=manage).status_code == 422
        bad = client.post("/v1/sources", json={**new, "name": "x", "every": "soon"}, headers=manage)
        assert bad.status_code == 422 and bad.json()["code"] == "bad_every"
        assert client.get("/v1/sources/team", headers=stranger).status_code == 404
        assert client.get("/v1/sources", headers=stranger).json() == {"sources": []}
        assert client.get("/v1/sources", headers=reader).status_code == 403
        look = client.post("/v1/sources/team/sync", json={"preview": True}, headers=manage)
        assert look.status_code == 200 and look.json()["counts"]["added"] == 3
        assert client.get("/v1/sources/team", headers=manage).json()["documents"] == 0
        waits = client.post("/v1/sources/team/sync", json={}, headers=manage).json()
        assert waits["status"] == "unconfirmed" and waits["counts"]["added"] == 3
        assert client.get("/v1/sources/team", headers=manage).json()["documents"] == 0
        yes = {"confirm": True}
        ran = client.post("/v1/sources/team/sync", json=yes, headers=manage).json()
        assert ran["status"] == "done" and ran["counts"]["added"] == 3
        listed = client.get("/v1/sources", headers=manage).json()["sources"]
        assert [(s["name"], s["documents"]) for s in listed] == [("team", 3)]
        gone = client.delete("/v1/sources/team", headers=manage)
        assert gone.status_code == 200 and "deleted: 3" in gone.json()["message"]
        assert client.get("/v1/sources/team", headers=manage).status_code == 404


def test_the_console_shows_each_source_previews_and_confirms_held_removals(tmp_path, ctx):
    from tests.support.apptest import assert_ok, open_console, texts

    share = FolderSide(tmp_path / "share")
    for i in range(4):
        share.put(f"f{i}.txt", body(i))
    share.add_source(ctx)
    at = open_console("sources")
    assert at.dataframe[0].value["Result"].tolist() == ["waits for confirmation"]
    at.button(key="source_preview").click().run()
    assert_ok(at)
    assert "Preview: 4 file(s) listed: 4 to add" in texts(at)
    assert "to embed" in texts(at) and syncing.get_source(ctx, "src").documents == 0
    at.button(key="source_sync").click().run()  # a new source's first sync waits: nothing done
    assert syncing.get_source(ctx, "src").documents == 0
    at.button(key="source_first").click().run()
    at.button(key="source_first:yes").click().run()
    assert_ok(at)
    assert syncing.get_source(ctx, "src").documents == 4
    assert at.dataframe[0].value["Added"].tolist() == [4]
    for i in range(4):
        share.delete(f"f{i}.txt")
    at.button(key="source_sync").click().run()
    assert_ok(at)
    assert "Removals held" in texts(at) and syncing.get_source(ctx, "src").documents == 4
    at.button(key="source_confirm").click().run()
    at.button(key="source_confirm:yes").click().run()
    assert_ok(at)
    view = syncing.get_source(ctx, "src")
    assert (view.documents, view.tombstoned) == (0, 4)


def test_the_cli_adds_lists_previews_syncs_and_removes_a_source(tmp_path, ctx, capsys):
    import json

    from sluice.cli.main import main

    share = FolderSide(tmp_path / "share")
    for i in range(3):
        share.put(f"f{i}.txt", body(i))
    share.put("notes.bin", b"\x00\x01")  # not a type Sluice reads: not listed
    folder = str(share.root)
    assert main(["sources", "add", "s", "--dataset", "docs", "--folder", folder]) == 0
    assert main(["sources", "add", "s", "--dataset", "docs", "--folder", folder]) == 1
    assert main(["sources", "add", "t", "--dataset", "docs", "--s3", "http://x"]) == 1
    assert "exists already" in capsys.readouterr().err
    assert main(["sync", "s", "--preview"]) == 0
    assert "3 to add" in capsys.readouterr().out
    assert main(["sync", "s"]) == 3 and "waits for confirmation" in capsys.readouterr().out
    assert syncing.get_source(ctx, "s").documents == 0
    assert main(["sync", "s", "--yes"]) == 0 and "3 to add" in capsys.readouterr().out
    assert main(["sources", "list", "--json"]) == 0
    [listed] = json.loads(capsys.readouterr().out)
    assert (listed["name"], listed["documents"], listed["last_run"]["added"]) == ("s", 3, 3)
    for i in range(3):
        share.delete(f"f{i}.txt")
    assert main(["sync", "s"]) == 3  # held: the folder came back empty
    assert "removals held" in capsys.readouterr().out
    assert main(["sync", "s", "--yes"]) == 0 and syncing.get_source(ctx, "s").tombstoned == 3
    assert main(["sources", "undo", "s"]) == 0 and syncing.get_source(ctx, "s").documents == 3
    assert main(["sources", "remove", "s", "--keep-documents"]) == 0
    assert "3 document(s) kept" in capsys.readouterr().out
    assert main(["sources", "list"]) == 0 and "no sources" in capsys.readouterr().out


def test_reconcile_repair_keeps_the_chunks_of_tombstoned_documents_for_undo(tmp_path, make_ctx):
    from sluice.pipeline.reconcile.audit import reconcile

    ctx = make_ctx()
    share = FolderSide(tmp_path / "share")
    for i in range(4):
        share.put(f"f{i}.txt", body(i))
    share.add_source(ctx)
    syncing.sync(ctx, "src", confirm=True)
    run_pending(ctx)
    share.delete("f1.txt")
    assert syncing.sync(ctx, "src").counts["removed"] == 1 and found(ctx, "zq1v0") == set()
    repaired = reconcile(ctx, repair=True, save=False)
    # kept for undo: neither orphans (vectors or lexical rows) nor served
    assert repaired.orphans == 0 and repaired.lexical_problems["orphans"] == 0, repaired.describe()
    [docs] = [d for d in repaired.datasets if d.name == "docs"]
    assert docs.kept == 2 and docs.lexical_kept == 2 and "2 kept for undo" in repaired.describe()
    assert found(ctx, "zq1v0") == set()
    jobs_before = job_count(ctx)
    assert "1 tombstoned" in syncing.undo(ctx, "src")
    assert found(ctx, "zq1v0") == {"f1.txt"} and job_count(ctx) == jobs_before
    after = reconcile(ctx, save=False)  # its chunks all came back with it: nothing missing
    assert after.clean and sum(d.kept for d in after.datasets) == 0, after.describe()


def test_a_late_success_does_not_bring_back_a_file_removed_while_its_job_ran(
    database_url, tmp_path, make_ctx
):
    ctx = make_ctx()
    share = FolderSide(tmp_path / "share")
    for i in range(4):
        share.put(f"f{i}.txt", body(i))
    share.add_source(ctx)
    syncing.sync(ctx, "src", confirm=True)
    removed: list[int] = []

    def remove(job_id: int, **info) -> None:  # the job has read its document, before it writes
        with Session(ctx.engine) as session:
            job = session.get(Job, job_id)
            if removed or job is None or job.filename != "f1.txt":
                return
        removed.append(job_id)
        share.delete("f1.txt")
        assert syncing.sync(ctx, "src").counts["removed"] == 1

    with faults.hook("before_supersede", remove):
        run_pending(ctx)
    assert removed and found(ctx, "zq1v0") == set() and found(ctx, "zq2v0") == {"f2.txt"}
    with Session(ctx.engine) as session:
        job = session.get(Job, removed[0])
        doc = session.get(Document, job.document_id)
    assert job.status == JobStatus.succeeded and doc.deleted_at is not None
    assert syncing.get_source(ctx, "src").tombstoned == 1
    jobs_before = job_count(ctx)
    assert "1 tombstoned" in syncing.undo(ctx, "src")  # its chunks were kept: back, not embedded
    assert found(ctx, "zq1v0") == {"f1.txt"} and job_count(ctx) == jobs_before


def test_a_key_adds_s3_sources_only_where_the_operator_allows(s3side, ctx, monkeypatch):
    """Before: a manage key could add a source on any bucket the deployment's credentials reach
    (the blob store's own included: every dataset's uploads became its documents), an ARN sent
    requests to hosts it chose, and a preview passed botocore's words back."""
    import httpx

    from sluice.ops import actions
    from sluice.ops.access import cli_operator
    from sluice.settings import reset_settings_cache
    from tests.support.api_server import InProcessApi, auth, make_key

    monkeypatch.setenv("SLUICE_API_SOURCE_S3_ALLOWED", f"{s3side.bucket}/team/,missing-bucket-x1")
    reset_settings_cache()
    assert actions.create_dataset(cli_operator(), "docs")[0]
    manage = auth(make_key("m", datasets=["docs"], scope="manage"))

    def add(name: str, where: str) -> httpx.Response:
        body = {"name": name, "dataset": "docs", "s3": where}
        return client.post("/v1/sources", json=body, headers=manage)

    with InProcessApi() as api, httpx.Client(base_url=api.url, timeout=30) as client:
        for where in (f"s3://{s3side.bucket}/other/", f"s3://another-{s3side.bucket}/team/"):
            refused = add("nope", where)
            assert refused.status_code == 422, refused.text
            assert refused.json()["code"] == "source_location_refused"
        arn = add("arn", "s3://arn:aws:s3:us-east-1:123456789012:accesspoint/x/team/")
        assert arn.status_code == 422 and arn.json()["code"] == "bad_source"
        assert add("team", f"s3://{s3side.bucket}/team/sub/").status_code == 201
        assert add("ghost", "s3://missing-bucket-x1/").status_code == 201
        look = client.post("/v1/sources/ghost/sync", json={"preview": True}, headers=manage)
        text = look.text
        assert "S3 refused: NoSuchBucket" in text, text
        assert (
            "127.0.0.1" not in text and "botocore" not in text.lower() and "ListObjects" not in text
        )


def test_no_source_follows_the_blob_stores_own_bucket(s3side, make_ctx):
    ctx = make_ctx(SLUICE_BLOB_STORE="s3", SLUICE_S3_BUCKET=s3side.bucket)
    with pytest.raises(syncing.SourceError) as refused:
        syncing.add_source(ctx, name="blobs", dataset="docs", s3=f"s3://{s3side.bucket}/")
    assert refused.value.code == "source_location_refused"
