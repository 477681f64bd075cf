"""Classified errors, backoff with jitter, the embedding cache, heartbeats and the reaper."""

import random
import time
from datetime import timedelta

from sqlmodel import Session

from sluice.ops.ingest import ingest_bytes
from sluice.pipeline.running.embed import HashEmbedder
from sluice.pipeline.running.runner import run_job
from sluice.storage import jobs
from sluice.storage.jobs import backoff_delay
from sluice.storage.models import Job, JobStatus, utcnow
from tests.support.helpers import Background, collection, events, ids_of_job, job
from tests.support.servers import free_port

LONG = "".join(
    f"Paragraph {i} explains part {i} of the manual in its own words. " * 12 + "\n\n"
    for i in range(40)
).encode()


class TimingOutEmbedder(HashEmbedder):
    """Times out on the given call numbers; remembers every text it encoded."""

    def __init__(self, fail_on_calls):
        self.fail_on_calls = set(fail_on_calls)
        self.calls = 0
        self.seen: list[str] = []

    def encode(self, texts):
        self.calls += 1
        if self.calls in self.fail_on_calls:
            raise TimeoutError("embedding call timed out after 30s")
        self.seen.extend(texts)
        return super().encode(texts)


def drive(ctx, job_id, timeout=30):
    """Run the job as a worker would: again whenever its retry is due, until it is final."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        j = job(ctx, job_id)
        if j.status in JobStatus.final():
            return j
        if j.next_attempt_at:
            time.sleep(max(0.0, (j.next_attempt_at - utcnow()).total_seconds()))
        run_job(job_id, ctx=ctx)
    raise AssertionError(f"job {job_id} not final: {job(ctx, job_id)}")


def test_backoff_is_exponential_capped_with_full_jitter():
    rng = random.Random(7)
    ceilings = [backoff_delay(a, base=2, cap=60, rng=rng)[0] for a in range(1, 8)]
    assert ceilings == [2, 4, 8, 16, 32, 60, 60]
    draws = [backoff_delay(3, base=2, cap=60, rng=rng)[1] for _ in range(200)]
    assert all(0 <= d <= 8 for d in draws)
    assert len({round(d, 6) for d in draws}) > 150  # jitter, not a fixed delay
    assert min(draws) < 2 and max(draws) > 6  # spread over the whole range


def test_embedder_times_out_twice_then_succeeds_on_attempt_three(make_ctx):
    flaky = TimingOutEmbedder(fail_on_calls={3, 5})
    ctx = make_ctx(embedder=flaky, SLUICE_EMBED_BATCH_SIZE="8")
    r = ingest_bytes(ctx, LONG, dataset="default", filename="manual.txt")

    j = drive(ctx, r.job_id)

    assert j.status == JobStatus.succeeded and j.attempt == 3
    evs = events(ctx, r.job_id)
    failed = [e for e in evs if e.kind == "attempt_failed"]
    assert len(failed) == 2 and all(e.data["kind"] == "transient" for e in failed)
    ceilings = [e.data["ceiling"] for e in failed]
    delays = [e.data["delay"] for e in failed]
    assert ceilings == [0.2, 0.4]  # exponential: base 0.2 s, doubling
    assert all(0 <= d <= c for d, c in zip(delays, ceilings, strict=True))
    assert all(d != c for d, c in zip(delays, ceilings, strict=True))  # jittered
    # Nothing was encoded twice: work of the failed attempts was reused.
    assert len(flaky.seen) == len(set(flaky.seen)) == j.chunk_count
    assert len(ids_of_job(ctx, r.job_id)) == j.chunk_count


class FlakyVectors:
    """The Chroma client, but the first ``n`` writes time out."""

    def __init__(self, inner, n):
        self.inner, self.n = inner, n

    def add(self, *a, **kw):
        if self.n > 0:
            self.n -= 1
            raise TimeoutError("chroma write timed out")
        return self.inner.add(*a, **kw)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_retry_after_a_failed_index_write_takes_embeddings_from_the_cache(make_ctx):
    ctx = make_ctx(SLUICE_EMBED_BATCH_SIZE="8")
    ctx.__dict__["vectors"] = FlakyVectors(ctx.vectors, 1)
    r = ingest_bytes(ctx, LONG, dataset="default", filename="manual.txt")

    j = drive(ctx, r.job_id)

    assert j.status == JobStatus.succeeded and j.attempt == 2
    assert j.cached_count == 8  # the batch embedded before the write failed
    assert j.embedded_count == j.chunk_count - 8
    failed = [e for e in events(ctx, r.job_id) if e.kind == "attempt_failed"]
    assert failed[0].data["code"] == "service_unavailable"


def cached_keys(services) -> int:
    from sluice.storage.cache import PREFIX

    return len(list(services.cache.client().scan_iter(match=f"{PREFIX}:*", count=1000)))


def test_flushing_the_cache_redis_loses_nothing(ctx, services):
    r = ingest_bytes(ctx, LONG, dataset="default", filename="manual.txt")
    assert run_job(r.job_id, ctx=ctx).result == "succeeded"
    total = job(ctx, r.job_id).chunk_count
    assert cached_keys(services) == total  # the run filled the cache

    services.cache.client().flushdb()
    assert cached_keys(services) == 0
    with Session(ctx.engine) as session:
        jobs.reindex(session=session, job_ids=[r.job_id], actor="test")
    ctx.vectors.delete(collection(ctx), where={"job_id": r.job_id})  # so the rebuild must embed

    assert run_job(r.job_id, ctx=ctx).result == "succeeded"
    j = job(ctx, r.job_id)
    assert (j.embedded_count, j.cached_count) == (total, 0)  # computed again, nothing lost
    assert len(ids_of_job(ctx, r.job_id)) == total
    assert cached_keys(services) == total  # and cached again


def test_cache_redis_down_costs_time_only(make_ctx, services):
    ctx = make_ctx(
        SLUICE_CACHE_REDIS_URL=f"redis://127.0.0.1:{free_port()}/0"
    )  # nothing listens there
    r = ingest_bytes(ctx, LONG, dataset="default", filename="manual.txt")

    assert run_job(r.job_id, ctx=ctx).result == "succeeded"
    j = job(ctx, r.job_id)
    assert j.attempt == 1 and j.embedded_count == j.chunk_count and j.cached_count == 0
    assert len(ids_of_job(ctx, r.job_id)) == j.chunk_count
    assert cached_keys(services) == 0


def test_permanent_error_is_tried_once(ctx):
    r = ingest_bytes(
        ctx, b"%PDF-1.7\n" + bytes(range(256)) * 40, dataset="default", filename="broken.pdf"
    )

    out = run_job(r.job_id, ctx=ctx)

    j = job(ctx, r.job_id)
    assert out.result == "failed" and j.status == JobStatus.failed
    assert j.error_kind.value == "permanent" and j.attempt == 1 and j.next_attempt_at is None
    assert j.fix_hint
    assert run_job(r.job_id, ctx=ctx).result == "noop"
    assert [e.kind for e in events(ctx, r.job_id)].count("claimed") == 1


def test_user_action_error_is_tried_once_with_its_hint(ctx, samples):
    data = (samples / "005-libreoffice-writer-password.pdf").read_bytes()
    r = ingest_bytes(ctx, data, dataset="default", filename="secret.pdf")

    run_job(r.job_id, ctx=ctx)

    j = job(ctx, r.job_id)
    assert j.status == JobStatus.failed and j.attempt == 1
    assert j.error_kind.value == "user_action_required" and j.error_code == "password_protected"
    assert "--password-stdin" in j.fix_hint and "remove the password and upload" in j.fix_hint
    assert "POST /v1/jobs/JOB/unlock" in j.fix_hint  # an API client learns its own way too


def test_heartbeat_advances_during_one_long_batch(make_ctx):
    class Slow(HashEmbedder):
        def encode(self, texts):
            time.sleep(3)
            return super().encode(texts)

    ctx = make_ctx(embedder=Slow(), SLUICE_EMBED_BATCH_SIZE="1000")
    r = ingest_bytes(ctx, LONG, dataset="default", filename="manual.txt")
    runner = Background(lambda: run_job(r.job_id, ctx=ctx), name="runner")
    runner.start()
    beats = set()
    deadline = time.monotonic() + 60
    while runner.is_alive() and time.monotonic() < deadline:
        j = job(ctx, r.job_id)
        if j.stage.value == "embedding" and j.status == JobStatus.running:
            beats.add(j.heartbeat_at)
        time.sleep(0.2)
    assert runner.result(5).result == "succeeded"
    assert job(ctx, r.job_id).status == JobStatus.succeeded
    assert len(beats) >= 3  # the one 3 s batch saw several beats at 0.5 s


def test_reaper_takes_back_stale_running_jobs_but_never_waiting_ones(ctx):
    waiting = ingest_bytes(ctx, b"waiting text " * 100, dataset="default", filename="w.txt")
    stale = ingest_bytes(ctx, b"stale text " * 100, dataset="default", filename="s.txt")
    old = utcnow() - timedelta(hours=1)
    with Session(ctx.engine) as session:
        w = session.get(Job, waiting.job_id)
        w.created_at = w.updated_at = old  # waited in the queue for an hour
        session.add(w)
        session.commit()
        claim = jobs.claim(
            session=session, job_id=stale.job_id, worker_id="ghost:1", lease_seconds=60
        )
        assert claim.claimed
        s = session.get(Job, stale.job_id)
        s.heartbeat_at = old
        session.add(s)
        session.commit()

    with Session(ctx.engine) as session:
        taken = jobs.reap(session=session, lease_seconds=60, base_delay=0.2, max_delay=1)

    assert taken == [stale.job_id]
    assert job(ctx, waiting.job_id).status == JobStatus.pending
    s = job(ctx, stale.job_id)
    assert s.status == JobStatus.retrying and s.error_code == "worker_lost"
    assert "ghost:1" in s.error_message
    assert run_job(stale.job_id, ctx=ctx).result == "succeeded"  # the reaped job runs again
    assert job(ctx, stale.job_id).attempt == 2


def test_a_collection_recreated_behind_the_workers_back_is_found_again(ctx):
    from sluice.storage.vectors import VectorStore

    first = ingest_bytes(ctx, LONG, dataset="default", filename="first.txt")
    assert run_job(first.job_id, ctx=ctx).result == "succeeded"  # this process now holds a handle
    name = collection(ctx)
    other = VectorStore(ctx.settings.chroma_url)  # another process drops and makes it again
    other.drop_collection(name)
    other.collection(name)

    second = ingest_bytes(
        ctx, LONG.replace(b"manual", b"guide"), dataset="default", filename="second.txt"
    )
    assert run_job(second.job_id, ctx=ctx).result == "succeeded", job(
        ctx, second.job_id
    ).error_message
    j = job(ctx, second.job_id)
    assert j.attempt == 1 and len(ids_of_job(ctx, second.job_id)) == j.chunk_count
