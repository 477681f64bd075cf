"""Run one job: claim, parse, chunk, embed, index, finish. Independent of Huey.

Any worker may call ``run_job(job_id, ctx=...)`` any number of times for the same job: the claim is
compare-and-set, chunk ids are stable, vectors already in the index are neither re-embedded nor
rewritten, and what an older run left beyond the new chunk count is deleted.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from sqlmodel import Session

from sluice.errors import JobCancelled, LeaseLost, PermanentError, UserActionError, classify
from sluice.pipeline import faults
from sluice.pipeline.chunk import Chunk, split_text
from sluice.pipeline.context import Context
from sluice.pipeline.parse import NO_TEXT_HINT, PDF, OcrOptions, ParseLimits, open_document
from sluice.storage import jobs
from sluice.storage.models import Dataset, Document, Job, Stage
from sluice.storage.vectors import chunk_id

log = logging.getLogger(__name__)

PROGRESS_EVERY_SECONDS = 0.5


@dataclass
class Outcome:
    job_id: int
    result: str  # succeeded | noop | retrying | failed | cancelled | lost
    message: str = ""


class Heartbeat(threading.Thread):
    """Beats the job's heartbeat while a long step (one big batch) keeps the worker busy; a beat
    also writes the stage counts the reporter holds back, so a long batch shows its stage."""

    def __init__(self, ctx: Context, job_id: int, lease: int, reporter: Reporter | None = None) -> None:
        super().__init__(daemon=True, name=f"heartbeat-{job_id}")
        self.ctx, self.job_id, self.lease, self.reporter = ctx, job_id, lease, reporter
        self.stopped = threading.Event()
        self.lost = False

    def run(self) -> None:
        while not self.stopped.wait(self.ctx.settings.heartbeat_seconds):
            try:
                if self.reporter is not None and self.reporter.flush():
                    continue
                with Session(self.ctx.engine) as session:
                    if not jobs.heartbeat(session=session, job_id=self.job_id, lease=self.lease):
                        self.lost = True
                        return
            except LeaseLost:
                self.lost = True
                return
            except Exception as exc:  # the database hiccuped; the next beat may get through
                log.warning("heartbeat of job %s failed: %s", self.job_id, exc)

    def stop(self) -> None:
        self.stopped.set()


class Reporter:
    """Holds the job's stage counts and writes them (which also beats the heartbeat) at most every
    half second, and when forced; the heartbeat thread writes what is held during one long batch.
    Raises JobCancelled when the operator asked to stop, LeaseLost when the job is no longer ours.

    A stage change alone does not force a write: a small job would otherwise pay a database write
    per stage (six, for a job that takes 20 ms); its claim and its success say all there is.
    """

    def __init__(self, ctx: Context, job_id: int, lease: int) -> None:
        self.ctx, self.job_id, self.lease = ctx, job_id, lease
        self.stage: Stage = Stage.parsing  # what the claim wrote
        self.last = time.monotonic()  # the claim counts as a write
        self.stage_started = self.last
        self.pending: dict | None = None
        self.seconds: dict[str, float] = {}  # time spent per stage, for the success event (and metrics)
        self.cancel = False
        self.page_count: int | None = None  # once parsing counted them; a failed job keeps it
        self._pending_lock = threading.Lock()
        self._write_lock = threading.Lock()

    def update(self, stage: Stage, done: int, total: int, *, force: bool = False, **extra) -> None:
        now = time.monotonic()
        if stage != self.stage:
            self.seconds[self.stage.value] = self.seconds.get(self.stage.value, 0.0) + now - self.stage_started
            self.stage, self.stage_started = stage, now
        elif now - self.stage_started > self.ctx.settings.stage_timeout_seconds:
            raise PermanentError(
                "stage_timeout",
                f"{stage.value} took longer than {self.ctx.settings.stage_timeout_seconds:.0f}s",
                "The document is too heavy to process in time. Split it, or raise SLUICE_STAGE_TIMEOUT_SECONDS.",
            )
        with self._pending_lock:
            self.pending = {**(self.pending or {}), **extra, "stage": stage, "done": done, "total": total}
        if force or now - self.last >= PROGRESS_EVERY_SECONDS:
            self.flush()
        if self.cancel:
            raise JobCancelled()

    def stage_seconds(self) -> dict[str, float]:
        """Seconds per stage so far, the current one included."""
        now = time.monotonic()
        spent = {**self.seconds}
        spent[self.stage.value] = spent.get(self.stage.value, 0.0) + now - self.stage_started
        return {k: round(v, 4) for k, v in spent.items()}

    def flush(self) -> bool:
        """Write the held counts, if any; remember a cancel request. False when nothing was held."""
        with self._write_lock:
            with self._pending_lock:
                values, self.pending = self.pending, None
            if values is None:
                return False
            with Session(self.ctx.engine) as session:
                cancel = jobs.progress(session=session, job_id=self.job_id, lease=self.lease, **values)
            self.last = time.monotonic()
            self.cancel = self.cancel or cancel
            return True


def run_job(job_id: int, *, ctx: Context) -> Outcome:
    s = ctx.settings
    with Session(ctx.engine, expire_on_commit=False) as session:
        claim = jobs.claim(session=session, job_id=job_id, worker_id=ctx.worker_id, lease_seconds=s.lease_seconds)
    if not claim.claimed:
        return Outcome(job_id, "noop", claim.reason)
    job = claim.job
    faults.hit("after_claim")
    report = Reporter(ctx, job_id, job.lease)
    beat = Heartbeat(ctx, job_id, job.lease, report)
    beat.start()
    try:
        return _execute(ctx, job, report)
    except LeaseLost as exc:
        log.warning("job %s: %s; stopping this attempt", job_id, exc)
        return Outcome(job_id, "lost", str(exc))
    except JobCancelled:
        _remove_partial(ctx, job)
        with Session(ctx.engine, expire_on_commit=False) as session:
            done = jobs.acknowledge_cancel(session=session, job_id=job_id, lease=job.lease, worker_id=ctx.worker_id)
        return Outcome(job_id, "cancelled", done.error_message if done else "")
    except Exception as exc:
        err = classify(exc)
        log.info("job %s attempt %s failed: %s %s", job_id, job.attempt, err.kind.value, err.message)
        with Session(ctx.engine, expire_on_commit=False) as session:
            after = jobs.fail(session=session, job_id=job_id, lease=job.lease, kind=err.kind, code=err.code,
                              message=err.message, hint=err.hint, detail=err.detail, worker_id=ctx.worker_id,
                              base_delay=s.retry_base_seconds, max_delay=s.retry_max_seconds,
                              page_count=report.page_count)
        if after is not None and after.status.value == "cancelled":
            _remove_partial(ctx, job)
        return Outcome(job_id, after.status.value if after else "lost", err.message)
    finally:
        beat.stop()


def _remove_partial(ctx: Context, job: Job) -> None:
    """Delete what this job wrote, unless those vectors are the ones search serves (a reindex)."""
    with Session(ctx.engine, expire_on_commit=False) as session:
        document = session.get(Document, job.document_id)
        dataset = session.get(Dataset, job.dataset_id)
    if document.active_job_id == job.id:
        return
    try:
        ctx.vectors.delete(dataset.collection, where={"job_id": job.id})
    except Exception as exc:  # reconcile finds and removes such orphans later
        log.warning("job %s: could not remove partial vectors: %s", job.id, exc)


def _execute(ctx: Context, job: Job, report: Reporter) -> Outcome:
    s = ctx.settings
    with Session(ctx.engine, expire_on_commit=False) as session:
        document = session.get(Document, job.document_id)
        dataset = session.get(Dataset, job.dataset_id)
    if job.pipeline_version != ctx.pipeline_version:
        # Chunk ids carry the job's version; chunking with other settings would mislabel them.
        raise UserActionError(
            "pipeline_version_mismatch",
            f"this job builds pipeline version {job.pipeline_version}, but this worker's chunking and "
            f"model settings make {ctx.pipeline_version}",
            "Give every worker the same SLUICE_CHUNK_* and SLUICE_EMBED* settings as the console, or run "
            "`sluice reindex --all` to build the version now in force.",
        )
    path = ctx.blobs.path(document.blob_key)
    if not path.exists():
        raise PermanentError("blob_missing", "the uploaded file is missing from the blob store",
                             "Upload the file again.")

    # Parsing: one page at a time, in a child process that a cancel or the stage deadline kills.
    parsed = open_document(path, media_type=document.media_type, max_pages=s.max_pages,
                           limits=ParseLimits.from_settings(s), name=document.filename,
                           waiting=lambda done, total: report.update(Stage.parsing, done, total),
                           ocr=OcrOptions.from_settings(s))
    parsed.on_ocr = lambda page, total: report.update(Stage.ocr, page, total)
    report.page_count = parsed.page_count
    pages: list[tuple[int, str]] = []
    chars = 0
    try:
        report.update(Stage.parsing, 0, parsed.page_count)
        for number, text in parsed.pages():
            pages.append((number, text))
            chars += len(text.strip())
            report.update(Stage.parsing, number, parsed.page_count)
    finally:
        parsed.close()
    if chars == 0:
        if document.media_type == PDF:
            raise UserActionError("no_text_layer", "the file has no extractable text (scanned images only)", NO_TEXT_HINT)
        raise UserActionError("no_text", "the file has no text", "Upload a file that has text in it.")
    faults.hit("after_parse")

    # Chunking: deterministic, page by page.
    chunks: list[Chunk] = []
    for i, (number, text) in enumerate(pages, start=1):
        for piece in split_text(text, size=s.chunk_size, overlap=s.chunk_overlap):
            chunks.append(Chunk(len(chunks), number, piece))
        if len(chunks) > s.max_chunks:
            raise UserActionError("too_many_chunks", f"the document makes more than {s.max_chunks} chunks",
                                  "Split the document, or raise SLUICE_MAX_CHUNKS.")
        pages[i - 1] = (number, "")  # free the page text as soon as it is chunked
        report.update(Stage.chunking, i, len(pages))
    del pages
    total = len(chunks)
    by_ocr = set(parsed.ocr_pages)
    where = parsed.where

    # Embedding and writing, batch by batch. Ids already in the index (an earlier attempt wrote
    # them) are neither embedded nor rewritten: upserting existing ids is ~12x slower than adding.
    collection = dataset.collection
    existing: set[str] = set()
    if job.lease > 1:
        existing = set(ctx.vectors.ids_where(collection, {"job_id": job.id}))
    ids = [chunk_id(document.sha256, job.pipeline_version, c.position) for c in chunks]
    embedded = cached = 0
    bs = s.embed_batch_size
    report.update(Stage.embedding, 0, total)
    for start in range(0, total, bs):
        batch = [(cid, c) for cid, c in zip(ids[start:start + bs], chunks[start:start + bs], strict=True)
                 if cid not in existing]
        if batch:
            e, c = _embed_and_add(ctx, collection, job, document, batch, by_ocr, where)
            embedded += e
            cached += c
        faults.hit("embed_batch")
        report.update(Stage.embedding, min(total, start + bs), total, embedded_count=embedded, cached_count=cached)

    # Indexing: drop what an older run left beyond the new chunk count, then verify.
    report.update(Stage.indexing, 0, total)
    stale = existing - set(ids)
    if stale:
        ctx.vectors.delete(collection, ids=sorted(stale))
    if job.lease > 1 or stale:
        held = len(ctx.vectors.ids_where(collection, {"job_id": job.id}))
        if held != total:
            raise PermanentError("index_mismatch", f"the index holds {held} chunks of this job, expected {total}",
                                 "Run `sluice reconcile --repair`, then retry the job.")
    report.update(Stage.indexing, total, total, force=True)
    faults.hit("after_index")

    with Session(ctx.engine, expire_on_commit=False) as session:
        superseded = jobs.succeed(session=session, job_id=job.id, lease=job.lease, chunk_count=total,
                                  page_count=parsed.page_count, worker_id=ctx.worker_id,
                                  embedded=embedded, cached=cached, warnings=parsed.warnings,
                                  stages=report.stage_seconds())
    if superseded is not None:
        try:
            ctx.vectors.delete(collection, where={"job_id": superseded})
        except Exception as exc:  # search already ignores them; reconcile removes them later
            log.warning("could not remove chunks of superseded job %s: %s", superseded, exc)
    return Outcome(job.id, "succeeded", f"{total} chunks")


def _embed_and_add(ctx: Context, collection: str, job: Job, document: Document,
                   batch: list[tuple[str, Chunk]], by_ocr: set[int] = frozenset(),
                   where: dict[int, str] | None = None) -> tuple[int, int]:
    texts = [c.text for _, c in batch]
    vectors = ctx.cache.get_many(texts)
    missing = [i for i, v in enumerate(vectors) if v is None]
    if missing:
        fresh = ctx.embedder.encode([texts[i] for i in missing])
        ctx.cache.put_many([texts[i] for i in missing], fresh)
        for i, vec in zip(missing, fresh, strict=True):
            vectors[i] = vec
    metadatas = [
        {"job_id": job.id, "document_id": document.id, "pipeline_version": job.pipeline_version,
         "position": c.position, "page": c.page, "filename": document.filename, "sha256": document.sha256,
         "ocr": c.page in by_ocr, **({"where": where[c.page]} if where and c.page in where else {})}
        for _, c in batch
    ]
    import numpy as np

    ctx.vectors.add(collection, ids=[cid for cid, _ in batch], embeddings=np.stack(vectors),
                    documents=texts, metadatas=metadatas)
    return len(missing), len(batch) - len(missing)
