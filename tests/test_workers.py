"""Many workers on one queue, database and Chroma server; and a queue Redis behind a password.

Three huey_consumer processes with process workers (not threads) share 30 jobs: every job is
claimed exactly once and the index holds exactly the expected chunk ids. The queue Redis started
with ``requirepass`` from its URL carries a job end to end; a wrong password gets a clear error and
loses nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pymupdf
import pytest
import redis
from sqlmodel import Session, select

from sluice.ops.ingest import ingest_bytes
from sluice.servers.processes import redis_argv
from sluice.storage.models import Document, JobEvent, JobStatus, Outbox
from sluice.storage.vectors import chunk_id
from tests.support.helpers import collection, events, job, wait_for
from tests.support.servers import ROOT, Consumer, ManagedProcess, free_port

WORDS = (
    "reservoir spillway aqueduct cistern culvert penstock flume headrace tailrace sluiceway".split()
)


def small_pdf(n: int) -> bytes:
    """Distinct documents of one to three pages, so chunk counts differ between jobs."""
    doc = pymupdf.open()
    for p in range(1 + n % 3):
        page = doc.new_page()
        for line in range(25):
            words = " ".join(WORDS[(n + p + line + i) % len(WORDS)] for i in range(10))
            page.insert_text(
                (40, 40 + 12 * line), f"doc {n} page {p + 1} line {line}: {words}", fontsize=8
            )
    data = doc.tobytes()
    doc.close()
    return data


def test_three_process_consumers_run_each_of_30_jobs_once(database_url, make_ctx, start_worker):
    ctx = make_ctx(SLUICE_CHUNK_SIZE="400", SLUICE_CHUNK_OVERLAP="50", SLUICE_EMBED_BATCH_SIZE="4")
    from sluice.pipeline.queueing.publishing import publish

    consumers = [start_worker(kind="process", workers=1, name=f"host{i}") for i in range(3)]
    results = [
        ingest_bytes(
            ctx, small_pdf(n), dataset="default", filename=f"doc-{n:02d}.pdf", publish=publish
        )
        for n in range(30)
    ]
    assert all(r.accepted and not r.duplicate for r in results)
    job_ids = [r.job_id for r in results]
    done = wait_for(ctx, job_ids, timeout=240)
    assert {j.status for j in done} == {JobStatus.succeeded}, [
        (j.id, j.status, j.error_message) for j in done
    ]
    assert all(c.alive() for c in consumers)

    with Session(ctx.engine) as session:
        claimed = Counter(
            session.exec(select(JobEvent.job_id).where(JobEvent.kind == "claimed")).all()
        )
        workers = set(session.exec(select(JobEvent.actor).where(JobEvent.kind == "claimed")).all())
        shas = {d.id: d.sha256 for d in session.exec(select(Document)).all()}
    assert {jid: claimed[jid] for jid in job_ids} == dict.fromkeys(job_ids, 1), (
        "a job ran more than once"
    )
    # The work was shared: claims came from more than one worker process.
    assert len(workers) >= 2, workers

    expected = {
        chunk_id(shas[j.document_id], j.pipeline_version, i)
        for j in done
        for i in range(j.chunk_count)
    }
    name = collection(ctx)
    held = [i for page in ctx.vectors.iter_pages(name, include=[]) for i in page["ids"]]
    assert len(held) == len(set(held)) == ctx.vectors.count(name)
    assert set(held) == expected
    assert (
        sum(j.chunk_count for j in done) == len(expected) and len({j.chunk_count for j in done}) > 1
    )


# --- a queue Redis with a password ----------------------------------------------------------------


PASSWORD = "queue-Secret-4711"


@pytest.fixture
def locked_queue(tmp_path):
    """A queue Redis started by sluice.servers.processes.redis_argv from a URL that carries a
    password."""
    port = free_port()
    url = f"redis://:{PASSWORD}@127.0.0.1:{port}/0"
    server = ManagedProcess(
        redis_argv("queue", url=url, data_dir=tmp_path / "locked"), log=tmp_path / "locked.log"
    )
    server.start()
    deadline = time.monotonic() + 30
    while True:
        try:
            redis.Redis.from_url(url).ping()
            break
        except redis.RedisError:
            if time.monotonic() > deadline or not server.alive():
                raise RuntimeError(f"password Redis did not start:\n{server.output()}") from None
            time.sleep(0.05)
    yield url
    server.stop()


def cli_ingest(env: dict, path: Path) -> dict:
    """`sluice ingest --json` in its own process (it binds the queue URL of its environment)."""
    done = subprocess.run(
        [sys.executable, "-m", "sluice.cli.main", "ingest", str(path), "--json"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)[0]


def wait_presence(
    client: redis.Redis, queue_name: str, consumer: Consumer, timeout: float = 60
) -> None:
    deadline = time.monotonic() + timeout
    while not any(client.scan_iter(match=f"sluice.workers.{queue_name}:*")):
        if not consumer.alive() or time.monotonic() > deadline:
            raise RuntimeError(f"consumer not ready:\n{consumer.output()[-3000:]}")
        time.sleep(0.1)


def test_a_password_protected_queue_carries_a_job_end_to_end(
    make_ctx, locked_queue, samples, tmp_path
):
    ctx = make_ctx()
    queue_name = f"locked{os.getpid()}"
    env = {**os.environ, "SLUICE_QUEUE_REDIS_URL": locked_queue, "SLUICE_QUEUE_NAME": queue_name}
    # The server really requires the password.
    with pytest.raises(redis.AuthenticationError):
        redis.Redis.from_url(locked_queue.replace(f":{PASSWORD}@", "")).ping()

    consumer = Consumer(env, tmp_path / "worker.log", workers=1)
    consumer.start()
    try:
        wait_presence(redis.Redis.from_url(locked_queue), queue_name, consumer)
        result = cli_ingest(env, samples / "001-minimal-document.pdf")
        assert result["accepted"] and result["published"], result
        assert wait_for(ctx, [result["job_id"]], timeout=60)[0].status == JobStatus.succeeded
        assert consumer.alive()
    finally:
        consumer.stop()
    assert PASSWORD not in consumer.output()


def test_a_wrong_queue_password_is_a_clear_error_and_loses_nothing(
    make_ctx, locked_queue, samples, tmp_path
):
    ctx = make_ctx()
    queue_name = f"wrong{os.getpid()}"
    right = {**os.environ, "SLUICE_QUEUE_REDIS_URL": locked_queue, "SLUICE_QUEUE_NAME": queue_name}
    wrong = {**right, "SLUICE_QUEUE_REDIS_URL": locked_queue.replace(PASSWORD, "not-the-password")}

    # The upload is kept and says what is wrong; the job waits with its outbox row unsent.
    result = cli_ingest(wrong, samples / "001-minimal-document.pdf")
    assert result["accepted"] and not result["published"]
    assert (
        "refused the password" in result["message"]
        and "SLUICE_QUEUE_REDIS_URL" in result["message"]
    )
    assert "not-the-password" not in json.dumps(result)
    with Session(ctx.engine) as session:
        row = session.exec(select(Outbox).where(Outbox.job_id == result["job_id"])).one()
    assert row.sent_at is None and "AuthenticationError" in row.last_error

    # A worker with the wrong password stays up, says why it cannot read the queue, runs nothing.
    bad = Consumer(wrong, tmp_path / "wrong-worker.log", workers=1)
    bad.start()
    try:
        deadline = time.monotonic() + 60
        while "AuthenticationError" not in bad.output():
            assert bad.alive() and time.monotonic() < deadline, bad.output()[-3000:]
            time.sleep(0.2)
        assert bad.alive()
    finally:
        bad.stop()
    assert "not-the-password" not in bad.output()
    assert wait_for(ctx, [result["job_id"]], statuses={"pending"}, timeout=5)

    # With the right password, recovery publishes the waiting job and it runs.
    good = Consumer(right, tmp_path / "right-worker.log", workers=1)
    good.start()
    try:
        assert wait_for(ctx, [result["job_id"]], timeout=90)[0].status == JobStatus.succeeded
    finally:
        good.stop()


def test_a_worker_of_another_instance_on_the_same_queue_leaves_our_messages_alone(
    database_url, make_ctx, start_worker, tmp_path, monkeypatch
):
    """Two instances (each its own data dir and job database) on one queue: the other instance's
    worker refuses our message loudly and puts it back; ours runs it, no republish needed."""
    from sluice.pipeline.queueing.publishing import publish

    monkeypatch.setenv(
        "SLUICE_REDELIVER_AFTER_SECONDS", "120"
    )  # a lost message would stay lost here
    ctx = make_ctx()
    other = start_worker(
        env={"SLUICE_DATA_DIR": str(tmp_path / "other-instance"), "SLUICE_DATABASE_URL": ""},
        workers=1,
        name="other-instance",
    )
    r = ingest_bytes(
        ctx,
        b"a page about the two instances on one queue. " * 200,
        dataset="default",
        filename="ours.txt",
        publish=publish,
    )
    assert r.published
    deadline = time.monotonic() + 30
    while "refused a message for job" not in other.output():
        assert time.monotonic() < deadline, other.output()[-2000:]
        time.sleep(0.1)
    assert ctx.instance_id in other.output()
    assert job(ctx, r.job_id).status.value == "pending"

    start_worker(workers=1, name="ours")
    [j] = wait_for(ctx, [r.job_id], timeout=60)

    assert j.status.value == "succeeded"
    assert [e.kind for e in events(ctx, r.job_id)] == ["created", "claimed", "succeeded"]


def test_queue_inspection_counts_only_this_instances_messages(make_ctx):
    """A message of another instance with the same job id number says nothing about our job: the
    recovery must still find ours stranded."""
    from sluice.pipeline.queueing.broker import queued_job_ids
    from sluice.pipeline.queueing.publishing import publish
    from sluice.pipeline.queueing.tasks import process_job

    ctx = make_ctx()
    r = ingest_bytes(
        ctx, b"a page about queue inspection. " * 100, dataset="default", filename="ours.txt"
    )
    process_job(r.job_id, "another-instance")  # the other instance's job with the same id
    assert queued_job_ids() == []
    publish(r.job_id)
    assert queued_job_ids() == [r.job_id]
