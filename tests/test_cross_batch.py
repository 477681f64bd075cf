"""Fuller batches across jobs: the embedding lanes of a worker process take their parts from the
texts of every job it runs at once, so small documents share parts; each job keeps its own
results, progress and cancel, and a cancelled job holds nobody's part."""

from __future__ import annotations

import threading
import uuid

from sqlmodel import Session

from sluice import faults
from sluice.ops.ingest import ingest_bytes
from sluice.pipeline.running import embed
from sluice.pipeline.running.chunk import split_text
from sluice.pipeline.running.runner import run_job
from sluice.storage import jobs
from sluice.storage.models import JobStatus
from tests.support.helpers import Background, collection, ids_of_job, job, until

HOLD = "hold the lane"


class LanedHash:
    """The hash embedder behind the real model's lanes: one lane, parts of four texts."""

    def __init__(self) -> None:
        self.inner = embed.HashEmbedder()
        self.model_id, self.dim, self.precision = (
            self.inner.model_id,
            self.inner.dim,
            self.inner.precision,
        )
        self.lanes = embed.Lanes(self.inner.encode, 1, 4)

    def encode(self, texts):
        return self.submit(texts).result()

    def submit(self, texts):
        return self.lanes.submit(texts, self.dim)


def document(name: str, chunks: int) -> tuple[bytes, list[str]]:
    """A document of ``chunks`` chunks, every word of its own; the chunks' texts."""
    tag = uuid.uuid4().hex[:8]
    paragraphs = [
        f"{name} {tag} paragraph {p}: " + " ".join(f"{name}{tag}w{p}x{j}" for j in range(25))
        for p in range(chunks)
    ]
    text = "\n\n".join(paragraphs)
    pieces = split_text(text, size=800, overlap=100)  # the default chunking: its chunks
    assert len(pieces) == chunks
    return text.encode(), pieces


def test_two_jobs_share_a_part_one_is_cancelled_the_other_keeps_only_its_own(make_ctx):
    laned = LanedHash()
    ctx = make_ctx(embedder=laned, SLUICE_EMBED_BATCH_SIZE="32", SLUICE_HEARTBEAT_SECONDS="0.1")
    ctx.vectors.collection(collection(ctx))  # connect first
    a_bytes, a_texts = document("alpha", 3)
    b_bytes, b_texts = document("beta", 2)
    a = ingest_bytes(ctx, a_bytes, dataset="default", filename="alpha.txt")
    b = ingest_bytes(ctx, b_bytes, dataset="default", filename="beta.txt")
    parts: list[list[str]] = []
    held, go_on = threading.Event(), threading.Event()
    shared, cancelled = threading.Event(), threading.Event()

    def on_part(texts: list[str]) -> None:
        parts.append(list(texts))
        if HOLD in texts:  # the lane is busy while both jobs queue their texts
            held.set()
            assert go_on.wait(60)
        elif any("alpha" in t for t in texts) and any("beta" in t for t in texts):
            shared.set()  # a part of both: alpha is cancelled while the lane encodes it
            assert cancelled.wait(60)

    with faults.hook("lane_part", on_part):
        blocker = laned.submit([HOLD])
        assert held.wait(30)
        runner_a = Background(lambda: run_job(a.job_id, ctx=ctx), name="alpha")
        runner_a.start()
        until(lambda: laned.lanes.queued() == 3 or runner_a.check(), timeout=60, what="alpha")
        runner_b = Background(lambda: run_job(b.job_id, ctx=ctx), name="beta")
        runner_b.start()
        until(lambda: laned.lanes.queued() == 5 or runner_b.check(), timeout=60, what="beta")
        go_on.set()
        blocker.result()
        assert shared.wait(30)
        try:
            with Session(ctx.engine) as session:
                [asked] = jobs.request_cancel(session=session, job_ids=[a.job_id], actor="op")
            assert asked.ok
            until(
                lambda: job(ctx, a.job_id).status == JobStatus.cancelled,
                timeout=30,
                what="alpha cancelled while its texts are on the lane",
            )
        finally:
            cancelled.set()
        out_a, out_b = runner_a.result(60), runner_b.result(60)

    # One part held texts of both jobs: alpha's three and beta's shortest.
    [both] = [p for p in parts if HOLD not in p and any("alpha" in t for t in p)]
    assert sorted(both) == sorted(a_texts + [min(b_texts, key=len)])
    assert out_b.result == "succeeded" and out_a.result != "succeeded"
    ja, jb = job(ctx, a.job_id), job(ctx, b.job_id)
    assert ja.status == JobStatus.cancelled and ids_of_job(ctx, a.job_id) == []
    assert jb.status == JobStatus.succeeded and jb.chunk_count == 2
    stored = ctx.vectors.get(collection(ctx), ids_of_job(ctx, b.job_id), include=["documents"])
    assert sorted(stored["documents"]) == sorted(b_texts)  # all of beta's, none of alpha's
    # each job's progress counts its own chunks only
    assert (jb.done, jb.total, jb.embedded_count) == (2, 2, 2)
    assert ja.embedded_count == 0 and ja.total in (0, 3)
