"""Run one job: claim, parse, chunk, embed, index, finish. Independent of Huey.

Any worker may call ``run_job(job_id, ctx=...)`` any number of times for the same job: the claim is
compare-and-set, chunk ids are stable, vectors already in the index are neither re-embedded nor
rewritten, and what an older run left beyond the new chunk count is deleted.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeVar

from sqlalchemy import text
from sqlmodel import Session

from sluice import faults
from sluice.errors import (
    ErrorKind,
    JobCancelled,
    LeaseLost,
    PermanentError,
    PipelineError,
    TransientError,
    UserActionError,
    WaitingError,
    classify,
    refused_connection,
)
from sluice.pipeline.parsing.parse import (
    NO_TEXT_HINT,
    PDF,
    OcrOptions,
    ParsedDocument,
    ParseLimits,
    open_document,
)
from sluice.pipeline.running import chunk_copies, embed, stopping, versions
from sluice.pipeline.running.chunk import Chunk, split_text
from sluice.pipeline.running.cleanup import remove_partial, remove_replaced_blobs
from sluice.pipeline.running.context import Context
from sluice.pipeline.running.progress import DATABASE_DOWN, Heartbeat, Reporter, retry_policy
from sluice.settings import Settings
from sluice.storage import chunk_edits, jobs, lexical
from sluice.storage.blobs import BlobMissing
from sluice.storage.chunk_edits import ChunkEdited, source_sha
from sluice.storage.db import stored
from sluice.storage.models import Dataset, Document, Job, Stage
from sluice.storage.vectors import chunk_id, metadata_fields

log = logging.getLogger(__name__)
T = TypeVar("T")

VERIFY_ROUNDS = 3  # looks at the index before success; missing chunks are written again in between
EDIT_ROUNDS = 5  # successes refused for a chunk edit that landed meanwhile, before a retry instead


@dataclass
class RunOutcome:
    job_id: int
    result: str  # succeeded | noop | retrying | failed | cancelled | lost
    message: str = ""


def run_job(
    job_id: int, *, ctx: Context, after_claim: Callable[[], object] | None = None
) -> RunOutcome:
    """Claim and run the job. ``after_claim`` runs once the claim is decided either way: the message
    left the queue, so the dispatcher may put the next one there."""
    s = ctx.settings
    if stopping.requested():  # the message goes back on the queue (worker.process_job)
        return RunOutcome(job_id, "noop", "the worker is stopping")

    def take() -> jobs.ClaimResult:
        with Session(ctx.engine, expire_on_commit=False) as session:
            return jobs.claim(
                session=session,
                job_id=job_id,
                worker_id=ctx.worker_id,
                lease_seconds=s.lease_seconds,
            )

    # The message is already off the queue: while the job database does not answer, hold it here and
    # claim when it does, instead of dropping it for recovery to republish a minute later.
    claim = _when_the_database_answers(ctx, job_id, take)
    if after_claim is not None:
        after_claim()
    job = claim.job
    if not claim.claimed or job is None:  # a claim that holds has its job
        return RunOutcome(job_id, "noop", claim.reason)
    faults.hit("after_claim")
    report = Reporter(ctx, job_id, job.lease)
    beat = Heartbeat(ctx, job, report)
    beat.start()
    try:
        return _execute(ctx, job, report, claim)
    except LeaseLost as exc:
        log.warning("job %s: %s; stopping this attempt", job_id, exc)
        return RunOutcome(job_id, "lost", str(exc))
    except JobCancelled:
        return _cancelled(ctx, job)
    except Exception as exc:
        if stopping.requested():  # the stop's doing (a service stopping beside it), not the job's
            return _handed_back(ctx, job, exc)
        return _failed(ctx, job, report, exc)
    finally:
        beat.stop()


def _handed_back(ctx: Context, job: Job, exc: Exception) -> RunOutcome:
    log.info("job %s: the worker is stopping (%s); handing the job back", job.id, exc)

    def give() -> Job | None:
        with Session(ctx.engine, expire_on_commit=False) as session:
            return jobs.hand_back(
                session=session,
                job_id=job.id,
                lease=job.lease,
                worker_id=ctx.worker_id,
                reason="the worker stopped",
            )

    done = _when_the_database_answers(ctx, job.id, give)
    return RunOutcome(job.id, "handed back" if done else "lost", str(exc))


def _cancelled(ctx: Context, job: Job) -> RunOutcome:
    """The operator's cancel, seen by the job's own thread: remove what it wrote, acknowledge."""
    job_id = job.id
    remove_partial(ctx, job)

    def acknowledge() -> Job | None:
        with Session(ctx.engine, expire_on_commit=False) as session:
            return jobs.acknowledge_cancel(
                session=session, job_id=job_id, lease=job.lease, worker_id=ctx.worker_id
            )

    done = _when_the_database_answers(ctx, job_id, acknowledge)
    return RunOutcome(job_id, "cancelled", (done.error_message or "") if done else "")


def _failed(ctx: Context, job: Job, report: Reporter, exc: Exception) -> RunOutcome:
    """The attempt failed: record it as classified (a retry, a wait for a service or for the new
    file, or a dead letter), fenced on the lease."""
    s, job_id = ctx.settings, job.id
    with contextlib.suppress(LeaseLost):  # the counts the throttle held: it failed where they say
        report.flush()
    err = classify(exc)
    waiting_for = err.waiting_for if isinstance(err, WaitingError) else _outage(ctx, err, exc)
    waiting_for = waiting_for or _file_replaced(ctx, job, report.blob_key)
    log.info(
        "job %s attempt %s failed: %s %s%s",
        job_id,
        job.attempt,
        err.kind.value,
        err.message,
        f" (waiting for {waiting_for})" if waiting_for else "",
    )
    wait = (
        jobs.WaitPolicy(waiting_for, s.outage_poll_seconds, s.max_outage_seconds)
        if waiting_for is not None
        else None
    )

    def record() -> Job | None:
        with Session(ctx.engine, expire_on_commit=False) as session:
            return jobs.fail(
                session=session,
                job_id=job_id,
                lease=job.lease,
                error=jobs.JobError.of(err),
                worker_id=ctx.worker_id,
                retry=retry_policy(s),
                wait=wait,
                page_count=report.page_count,
            )

    after = _when_the_database_answers(ctx, job_id, record)
    if after is not None and after.status.value == "cancelled":
        remove_partial(ctx, job)
    return RunOutcome(job_id, after.status.value if after else "lost", err.message)


def _when_the_database_answers(ctx: Context, job_id: int, write: Callable[[], T]) -> T:
    """Claim the job, or write the attempt's outcome, waiting (up to SLUICE_MAX_OUTAGE_SECONDS)
    while the job database does not answer: the message or the outcome is not lost, and the job is
    not left running for the reaper to count as a lost worker. Its heartbeat, beating again once the
    database is back, keeps the reaper off (which also waits a lease after an outage of its own)."""
    s = ctx.settings
    deadline = time.monotonic() + s.max_outage_seconds
    while True:
        try:
            return write()
        except DATABASE_DOWN as exc:
            if time.monotonic() > deadline:
                raise
            log.warning(
                "job %s: the job database does not answer (%s); trying again when it does",
                job_id,
                str(exc).splitlines()[0][:200],
            )
            time.sleep(s.outage_poll_seconds)


def _refused_by_chroma(exc: BaseException) -> bool:
    """Did Chroma refuse or drop this request? Then its outage caused the failure, even when it is
    answering again by the time anyone asks (a restart): the attempt is not the job's."""
    seen: set[int] = set()
    chain: list[BaseException] = []
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        chain.append(e)
        e = e.__cause__ or e.__context__
    from_http = any(
        type(x).__module__.split(".")[0] in ("httpx", "httpcore", "chromadb") for x in chain
    )
    return from_http and any(refused_connection(x) for x in chain)


def _outage(ctx: Context, err: PipelineError, exc: BaseException | None = None) -> str | None:
    """After a transient failure: is a service the job needs down? Then it is an outage, not the
    job's failure. A request Chroma refused says so by itself; otherwise the services are asked,
    so a slow request of one job counts as its own."""
    if err.kind != ErrorKind.transient or err.code not in ("service_unavailable", "internal_error"):
        return None
    if exc is not None and _refused_by_chroma(exc):
        return f"Chroma at {ctx.settings.chroma_url}"
    try:
        ctx.vectors.heartbeat()
    except Exception as exc:
        log.info("Chroma does not answer its heartbeat: %s", exc)
        return f"Chroma at {ctx.settings.chroma_url}"
    try:
        with ctx.engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except Exception as exc:
        log.info("the job database does not answer: %s", exc)
        return "the job database"
    return None


def _file_replaced(ctx: Context, job: Job, read: str | None) -> str | None:
    """Was the document's file replaced while the attempt read it (an unlock)? Then whatever went
    wrong is not the job's: it runs again, with the attempt given back, on the new file."""
    if read is None:
        return None
    with Session(ctx.engine) as session:
        document = session.get(Document, job.document_id)
    if document is None or document.blob_key == read:
        return None
    return "its new file (the document's file was replaced during the attempt)"


def _execute(ctx: Context, job: Job, report: Reporter, claim: jobs.ClaimResult) -> RunOutcome:
    """One attempt, as its steps: load, parse, chunk, embed and write, verify, finish."""
    loaded = _load(ctx, job, report, claim)
    if isinstance(loaded, RunOutcome):  # another pipeline version is in force
        return loaded
    document, dataset, s = loaded
    parsed, pages = _fetch_and_parse(ctx, job, document, s, report)
    made = _chunk(pages, s, report)
    del pages
    edits = _edits(ctx, document)
    chunks = _edited(edits, made)  # the chunks edited by hand carry their edits' text
    total = len(chunks)
    out = _Output(
        ctx, dataset.collection, job, document, report, set(parsed.ocr_pages), parsed.where
    )
    # Ids already in the index (an earlier attempt wrote them) are neither embedded nor
    # rewritten: upserting existing ids is ~12x slower than adding.
    existing: set[str] = set()
    if job.lease > 1:
        existing = set(ctx.vectors.ids_where(out.collection, {"job_id": job.id}))
    ids = [chunk_id(document.sha256, job.pipeline_version, c.position) for c in chunks]
    if existing and edits.touched:  # an earlier attempt may have written another text of these
        touched = edits.touched
        redo = {cid for cid, c in zip(ids, made, strict=True) if source_sha(c.text) in touched}
        redo &= existing
        if redo:
            ctx.vectors.delete(out.collection, ids=sorted(redo))
            existing -= redo
    embedded, cached = _embed_and_write(out, ids, chunks, existing, s.embed_batch_size)

    # Indexing: drop what an older run left beyond the new chunk count, then verify.
    report.update(Stage.indexing, 0, total)
    stale = existing - set(ids)
    if stale:
        ctx.vectors.delete(out.collection, ids=sorted(stale))
    faults.hit("before_verify", job_id=job.id)
    if existing & set(ids):  # see _verify: what this attempt added itself is there
        again, again_cached = _verify(out, ids, chunks, s.embed_batch_size)
        embedded, cached = embedded + again, cached + again_cached
    # The lexical index: every chunk's words under the same ids, all rewritten in one transaction.
    _write_words(out, dataset.id, ids, chunks)
    # Written before the success: a worker that dies here leaves its job at indexing, counted.
    report.update(Stage.indexing, total, total, force=True)
    faults.hit("after_index")
    for _ in range(EDIT_ROUNDS):
        try:
            return _finish(out, parsed, total, embedded, cached, edits_seen=edits.seen)
        except ChunkEdited:  # an edit landed while this ran: write it into this version, again
            edits = _edits(ctx, document, again=True)
            now = _edited(edits, made)
            changed = [(cid, c) for cid, c, was in zip(ids, now, chunks, strict=True) if c != was]
            if changed:
                ctx.vectors.delete(out.collection, ids=[cid for cid, _ in changed])
                for start in range(0, len(changed), s.embed_batch_size):
                    part = changed[start : start + s.embed_batch_size]
                    out.finish(_Batch.start(ctx, part, end=0, dataset_id=job.dataset_id))
            chunks = now
            _write_words(out, dataset.id, ids, chunks)
    raise TransientError(
        "chunk_edited",
        f"the chunks of document {document.id} kept being edited while this job built them",
        "Sluice retries this by itself.",
    )


def _edits(ctx: Context, document: Document, *, again: bool = False) -> chunk_edits.Edits:
    """The document's chunk edits; none read for a document never edited (as the claim read it),
    which its success's compare-and-set then holds to."""
    if document.last_edit_id is None and not again:
        return chunk_edits.Edits()
    with Session(ctx.engine) as session:
        return chunk_edits.current(session, document.id)


def _edited(edits: chunk_edits.Edits, made: list[Chunk]) -> list[Chunk]:
    """The chunks the pipeline ``made``, each edited one with its edit's text (and the made
    text's sha, which its vector's metadata keeps)."""
    out = []
    for c in made:
        edit = edits.edit_of(c.text)
        out.append(c if edit is None else replace(c, text=edit[0], source_sha=edit[1]))
    return out


def _write_words(out: _Output, dataset_id: int, ids: list[str], chunks: list[Chunk]) -> None:
    """The job's rows of the word index, exactly these chunks (fenced on the attempt's lease)."""
    lexical.write_job(
        out.ctx.engine,
        dataset_id=dataset_id,
        document_id=out.document.id,
        job_id=out.job.id,
        rows=[
            lexical.Row(cid, c.position, c.page, c.text) for cid, c in zip(ids, chunks, strict=True)
        ],
        lease=out.job.lease,
    )


def _load(
    ctx: Context, job: Job, report: Reporter, claim: jobs.ClaimResult
) -> tuple[Document, Dataset, Settings] | RunOutcome:
    """The job's document, dataset (as the claim read them) and parse settings; an outcome
    instead when the job's pipeline version is no longer the one in force."""
    document, dataset = claim.document, claim.dataset
    if document is None or dataset is None:
        with Session(ctx.engine, expire_on_commit=False) as session:
            document = stored(session, Document, job.document_id)
            dataset = stored(session, Dataset, job.dataset_id)
    # The dataset's own parse settings (read with the job, so a change needs no worker restart).
    s = ctx.settings_for(dataset)
    version = ctx.version_for(dataset)
    if job.pipeline_version != version:  # wait for a worker of it, or build the one in force
        followed = versions.follow(ctx, job, dataset, version)
        if followed == "superseded":
            remove_partial(ctx, job)
        if followed != "moved":
            return RunOutcome(job.id, followed, f"pipeline {version} is built instead")
    report.blob_key = document.blob_key
    return document, dataset, s


def _fetch_and_parse(
    ctx: Context, job: Job, document: Document, s: Settings, report: Reporter
) -> tuple[ParsedDocument, list[tuple[int, str]]]:
    """The document's file on this host (the object store's copy streamed to a scratch file, never
    whole in memory), parsed, and the scratch file gone again. An object store that does not answer
    raises its outage (the job waits, its attempt unspent)."""
    try:
        with ctx.blobs.local_copy(document.blob_key) as path:
            faults.hit("before_open", job_id=job.id)
            return _parse(document, path, s, report)
    except BlobMissing:
        raise PermanentError(
            "blob_missing",
            "the uploaded file is missing from the blob store",
            "Upload the file again.",
        ) from None


def _parse(
    document: Document, path: Path, s: Settings, report: Reporter
) -> tuple[ParsedDocument, list[tuple[int, str]]]:
    """Parsing: one page at a time, in a child process that a cancel or the stage deadline kills.
    The document (closed, with its page count, warnings and OCR pages) and its pages' text."""
    read_by_ocr: set[int] = set()  # a page OCR read stays "ocr n/N": a failure there says OCR

    def stage_of(page: int) -> Stage:
        return Stage.ocr if page in read_by_ocr else Stage.parsing

    parsed = open_document(
        path,
        media_type=document.media_type,
        max_pages=s.max_pages,
        limits=ParseLimits.from_settings(s),
        name=document.filename,
        waiting=lambda done, total: report.update(stage_of(done), done, total),
        ocr=OcrOptions.from_settings(s),
    )

    def on_ocr(page: int, total: int) -> None:
        read_by_ocr.add(page)
        report.update(Stage.ocr, page, total)

    parsed.on_ocr = on_ocr
    report.page_count = parsed.page_count
    pages: list[tuple[int, str]] = []
    chars = 0
    try:
        report.update(Stage.parsing, 0, parsed.page_count)
        for number, text in parsed.pages():
            pages.append((number, text))
            chars += len(text.strip())
            report.update(stage_of(number), number, parsed.page_count)
        # Written on the job with the first batch (``Reporter.fence``), or sooner by the throttle
        # or a beat: the Jobs page tells it while chunks are embedded.
        n = parsed.page_count
        report.update(Stage.parsing, n, n, page_count=n)
    finally:
        parsed.close()
    if chars == 0:
        if document.media_type == PDF:
            raise UserActionError(
                "no_text_layer",
                "the file has no extractable text (scanned images only)",
                NO_TEXT_HINT,
            )
        raise UserActionError(
            "no_text", "the file has no text", "Upload a file that has text in it."
        )
    faults.hit("after_parse")
    return parsed, pages


def _chunk(pages: list[tuple[int, str]], s: Settings, report: Reporter) -> list[Chunk]:
    """Chunking: deterministic, page by page; each page's text is freed once it is chunked."""
    chunks: list[Chunk] = []
    for i, (number, content) in enumerate(pages, start=1):
        for piece in split_text(content, size=s.chunk_size, overlap=s.chunk_overlap):
            chunks.append(Chunk(len(chunks), number, piece))
        if len(chunks) > s.max_chunks:
            raise UserActionError(
                "too_many_chunks",
                f"the document makes more than {s.max_chunks} chunks",
                "Split the document, or raise SLUICE_MAX_CHUNKS.",
            )
        pages[i - 1] = (number, "")  # free the page text as soon as it is chunked
        report.update(Stage.chunking, i, len(pages))
    return chunks


@dataclass
class _Output:
    """Where an attempt writes its batches, and what their metadata says of each chunk."""

    ctx: Context
    collection: str
    job: Job
    document: Document
    report: Reporter
    by_ocr: set[int]
    where: dict[int, str]

    def finish(self, batch: _Batch) -> tuple[int, int]:
        """Write a batch whose vectors are being made; (embedded, from cache)."""
        return batch.finish(
            self.ctx, self.collection, self.job, self.document, self.report, self.by_ocr, self.where
        )


def _embed_and_write(
    out: _Output, ids: list[str], chunks: list[Chunk], existing: set[str], bs: int
) -> tuple[int, int]:
    """Embedding and writing, batch by batch, skipping the ids already in the index; returns
    (embedded, from cache).

    Two batches in flight: while the lanes encode one, this thread writes the one before (cache,
    Chroma) and looks up the next, so the model never waits for a write. A batch counts as
    embedded once its vectors exist and are in the store."""
    total = len(chunks)
    embedded = cached = 0
    out.report.update(Stage.embedding, 0, total)
    in_flight: _Batch | None = None

    def write(batch: _Batch) -> None:
        """Write a batch whose vectors are being made (cache, Chroma), then say it is embedded."""
        nonlocal embedded, cached
        e, c = out.finish(batch)
        embedded, cached = embedded + e, cached + c
        out.report.update(
            Stage.embedding, batch.end, total, embedded_count=embedded, cached_count=cached
        )

    try:
        for start in range(0, total, bs):
            batch = [
                (cid, c)
                for cid, c in zip(ids[start : start + bs], chunks[start : start + bs], strict=True)
                if cid not in existing
            ]
            ahead = _Batch.start(
                out.ctx, batch, end=min(total, start + bs), dataset_id=out.job.dataset_id
            )
            try:
                if in_flight is not None:
                    write(in_flight)
            except BaseException:  # the batch ahead encodes for nothing: stop it too
                ahead.cancel()
                raise
            in_flight = ahead
        if in_flight is not None:
            write(in_flight)
            in_flight = None
    finally:
        # the attempt ended early: the lanes need not encode what is queued
        if in_flight is not None:
            in_flight.cancel()
    return embedded, cached


def _verify(out: _Output, ids: list[str], chunks: list[Chunk], bs: int) -> tuple[int, int]:
    """Success is judged on what the index holds now, not on what this attempt believes it wrote:
    ids an earlier attempt left (skipped above) may have gone meanwhile (a repair removed them as
    orphans of a failed job). Write back what is missing, from the cache, and look again; returns
    (embedded, from cache) of what was written again.

    Called only when the attempt skipped ids it found: an id this attempt added itself is in the
    index once the add returned (Chroma answers an add after it is written, and reads see it), and
    nothing removes a running job's chunks but what also ends its lease (a cancel, a delete, a
    supersede, the reaper), which the success's compare-and-set then refuses; a repair's delete
    still in flight is checked by the repair itself (``reconcile.audit``, after its delete)."""
    embedded = cached = 0
    total = len(chunks)
    job = out.job
    for _ in range(VERIFY_ROUNDS):
        held = set(out.ctx.vectors.ids_where(out.collection, {"job_id": job.id}))
        missing = [(cid, c) for cid, c in zip(ids, chunks, strict=True) if cid not in held]
        if not missing:
            break
        log.warning(
            "job %s: %d of its %d chunks are not in the index; writing them again",
            job.id,
            len(missing),
            total,
        )
        for start in range(0, len(missing), bs):
            e, c = out.finish(
                _Batch.start(out.ctx, missing[start : start + bs], end=0, dataset_id=job.dataset_id)
            )
            embedded += e
            cached += c
    else:
        raise TransientError(
            "index_incomplete",
            f"the index holds {total - len(missing)} of the {total} "
            "chunks of this job after writing the missing ones again",
            "Sluice retries this by itself; if it keeps happening, run `sluice reconcile`.",
        )
    return embedded, cached


def _finish(
    out: _Output,
    parsed: ParsedDocument,
    total: int,
    embedded: int,
    cached: int,
    *,
    edits_seen: int | None = None,
) -> RunOutcome:
    """Succeed the job (fenced on its lease), then remove the chunks of the jobs it supersedes."""
    ctx, job = out.ctx, out.job
    read: list[Document] = []  # the document as the success read it, in its transaction
    with Session(ctx.engine, expire_on_commit=False) as session:
        superseded = jobs.succeed(
            session=session,
            job_id=job.id,
            lease=job.lease,
            worker_id=ctx.worker_id,
            built=jobs.Built(
                chunks=total,
                pages=parsed.page_count,
                embedded=embedded,
                cached=cached,
                warnings=parsed.warnings,
                stages=out.report.stage_seconds(),
                edits_seen=edits_seen,
            ),
            read=read.append,
        )
    now, was = read[-1] if read else out.document, out.document
    faults.hit("after_switch", job_id=job.id)  # search serves this job; older chunks still there
    if chunk_copies.copies(now.filename, now.metadata_) != chunk_copies.copies(
        was.filename, was.metadata_
    ):
        # Changed while this attempt wrote: the change's own rewrite ran before these chunks were
        # all there (it saw this job inactive or its chunks not yet written). This read comes
        # after the last batch, so a change later than it finds them all and rewrites them itself.
        try:
            chunk_copies.rewrite(
                ctx, out.collection, {"job_id": job.id}, now.metadata_, filename=now.filename
            )
        except Exception as exc:  # search filters on the document row; reconcile repairs copies
            log.warning("job %s: could not bring its chunks' metadata up to date: %s", job.id, exc)
    for old in superseded:
        try:
            ctx.vectors.delete(out.collection, where={"job_id": old})
            lexical.delete_job(ctx.engine, old)
        except Exception as exc:  # search already ignores them; reconcile removes them later
            log.warning("could not remove chunks of superseded job %s: %s", old, exc)
    try:  # the versions of its external id this document replaced: their bytes, unless shared
        if out.document.external_id is not None:  # only a version of an external id replaces
            remove_replaced_blobs(ctx, job.document_id)
    except Exception as exc:  # kept for now; nothing serves them
        log.warning("could not remove the blobs replaced by document %s: %s", job.document_id, exc)
    return RunOutcome(job.id, "succeeded", f"{total} chunks")


@dataclass
class _Batch:
    """One batch on its way: looked up in the embedding cache, its misses encoding on the lanes."""

    items: list[tuple[str, Chunk]]
    vectors: list
    missing: list[int]
    encoding: embed.Encoding | embed.Deferred | None
    end: int  # chunks of the document up to this batch's end (for progress)
    dataset_id: int  # the cache is per dataset

    @classmethod
    def start(
        cls, ctx: Context, items: list[tuple[str, Chunk]], *, end: int, dataset_id: int
    ) -> _Batch:
        if not items:
            return cls(items, [], [], None, end, dataset_id)
        texts = [c.text for _, c in items]
        vectors = ctx.cache.get_many(texts, dataset_id=dataset_id)
        missing = [i for i, v in enumerate(vectors) if v is None]
        encoding = embed.submit(ctx.embedder, [texts[i] for i in missing]) if missing else None
        return cls(items, vectors, missing, encoding, end, dataset_id)

    def finish(
        self,
        ctx: Context,
        collection: str,
        job: Job,
        document: Document,
        report: Reporter,
        by_ocr: Collection[int] = frozenset(),
        where: dict[int, str] | None = None,
    ) -> tuple[int, int]:
        """Wait for the encoding, cache it, write the batch to the store; (embedded, from cache)."""
        if self.items:
            texts = [c.text for _, c in self.items]
            if self.encoding is not None:
                fresh = self.encoding.result()
                missed = [texts[i] for i in self.missing]
                ctx.cache.put_many(missed, fresh, dataset_id=self.dataset_id)
                for i, vec in zip(self.missing, fresh, strict=True):
                    self.vectors[i] = vec
            metadatas = [
                {
                    "job_id": job.id,
                    "document_id": document.id,
                    "pipeline_version": job.pipeline_version,
                    "position": c.position,
                    "page": c.page,
                    "filename": document.filename,
                    "sha256": document.sha256,
                    "ocr": c.page in by_ocr,
                    **({"where": where[c.page]} if where and c.page in where else {}),
                    **({"source_sha": c.source_sha, "edited": True} if c.source_sha else {}),
                    **metadata_fields(document.metadata_),
                }
                for _, c in self.items
            ]
            import numpy as np

            # an encode may have outlived the attempt: never write for one that is over
            report.fence()
            ctx.vectors.add(
                collection,
                ids=[cid for cid, _ in self.items],
                embeddings=np.stack(self.vectors),
                documents=texts,
                metadatas=metadatas,
            )
        faults.hit("embed_batch")
        return len(self.missing), len(self.items) - len(self.missing)

    def cancel(self) -> None:
        if self.encoding is not None:
            self.encoding.cancel()
