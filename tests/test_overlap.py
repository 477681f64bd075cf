"""The model never waits for a write: while the lanes encode one batch, the job's thread writes the
batch before it (cache, Chroma) and looks up the next. Progress stays honest: a chunk counts as
embedded once its vector is in the store."""

import threading

from sluice import faults
from sluice.ops.ingest import ingest_bytes
from sluice.pipeline.running import embed
from sluice.pipeline.running.runner import run_job
from tests.support.helpers import ids_of_job, job
from tests.test_reconcile import text


class Lanes:
    """The hash embedder behind the real model's lanes: ``submit`` returns at once."""

    def __init__(self) -> None:
        self.inner = embed.HashEmbedder()
        self.model_id, self.dim, self.precision = (
            self.inner.model_id,
            self.inner.dim,
            self.inner.precision,
        )
        self.lanes = embed.Lanes(self.inner.encode, 2, 4)
        self.log: list[tuple[str, int]] = []
        self.lock = threading.Lock()
        self.submitted = 0

    def encode(self, texts):
        return self.submit(texts).result()

    def submit(self, texts):
        with self.lock:
            self.submitted += 1
            self.log.append(("submit", self.submitted))
        return self.lanes.submit(texts, self.dim)


def test_the_next_batch_is_encoding_while_the_one_before_is_written(make_ctx):
    lanes = Lanes()
    ctx = make_ctx(embedder=lanes, SLUICE_EMBED_BATCH_SIZE="4")
    r = ingest_bytes(ctx, text("harbour", paragraphs=30), dataset="default", filename="harbour.txt")
    written: list[int] = []
    counts: list[tuple[int, int | None]] = []

    def on_write(**_):
        with lanes.lock:
            written.append(len(written) + 1)
            lanes.log.append(("written", len(written)))
        counts.append((len(ids_of_job(ctx, r.job_id)), job(ctx, r.job_id).embedded_count))

    with faults.hook("embed_batch", on_write):
        assert run_job(r.job_id, ctx=ctx).result == "succeeded"
    j = job(ctx, r.job_id)
    batches = -(-j.chunk_count // 4)
    assert batches >= 4 and len(written) == batches == lanes.submitted
    # Batch n is written only once batch n+1 is on the lanes (the last one has no successor).
    for n in range(1, batches):
        assert lanes.log.index(("submit", n + 1)) < lanes.log.index(("written", n)), lanes.log
    # Honest counts: what the job reports as embedded is never more than the store holds.
    for held, reported in counts:
        assert (reported or 0) <= held
    assert (j.embedded_count, len(ids_of_job(ctx, r.job_id))) == (j.chunk_count, j.chunk_count)
