"""Previews before bulk work: how many jobs, how many chunks, how many the embedding cache already
holds, and how many must be embedded. Nothing is changed.

A job's chunks are counted the way the runner makes them: parse the blob, chunk it with the current
settings, skip the ids the index already holds for that job (a re-run never embeds those again),
and ask the cache about the rest. Past ``sample`` documents the figures are extrapolated from the
ones parsed, and the preview says so.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

from sqlmodel import Session

from sluice.pipeline.parsing.parse import OcrOptions, ParseLimits, open_document
from sluice.pipeline.running.chunk import split_text
from sluice.pipeline.running.context import Context
from sluice.settings import Settings
from sluice.storage import queries
from sluice.storage.db import stored
from sluice.storage.jobs import get_job
from sluice.storage.models import Dataset, Document, Job
from sluice.storage.vectors import chunk_id

log = logging.getLogger(__name__)

SAMPLE = 200  # documents parsed for one preview; the rest are extrapolated
BUDGET_SECONDS = 5.0  # parsing stops sampling after this long (each document costs a child process)


@dataclass
class Preview:
    jobs: int = 0
    documents: int = 0
    chunks: int = 0  # chunks the jobs will have
    in_index: int = 0  # already in the vector store for these jobs: not embedded again
    cached: int = 0  # in the embedding cache: written without the model
    to_embed: int = 0  # must go through the model
    unreadable: int = 0  # sampled documents whose blob is gone or cannot be parsed (they will fail)
    sampled: int = 0  # documents actually parsed
    estimated: bool = False  # True when figures are extrapolated from the sample

    @property
    def cache_hit_rate(self) -> float:
        pending = self.cached + self.to_embed
        return self.cached / pending if pending else 0.0

    def to_dict(self) -> dict:
        return {**asdict(self), "cache_hit_rate": round(self.cache_hit_rate, 4)}

    def time_at(self, chunks_per_second: float | None) -> str:
        """How long the work takes at a measured rate (chunks finished per busy second, the
        Overview's drain rate: cached chunks count in it as they do here), or that none was
        measured: never a figure of its own."""
        if not self.chunks:
            return "nothing to build"
        if not chunks_per_second:
            return "no recent rate measured (no job finished in the last hour), so no time estimate"
        minutes = self.chunks / chunks_per_second / 60
        said = "under 1 min" if minutes < 1 else f"about {minutes:,.0f} min"
        return f"{said} at the last hour's rate ({chunks_per_second:,.1f} chunks/s while busy)"

    def describe(self) -> str:
        about = "about " if self.estimated else ""
        text = (
            f"{self.jobs} job(s), {about}{self.chunks:,} chunk(s): {about}{self.in_index:,} "
            f"already in the index, {about}{self.cached:,} in the embedding cache, "
            f"{about}{self.to_embed:,} to embed"
        )
        if self.unreadable:
            text += f"; {self.unreadable} sampled document(s) cannot be read and will fail again"
        if self.estimated:
            text += f" (estimated from {self.sampled} parsed document(s))"
        return text


def document_texts(ctx: Context, document: Document, settings: Settings | None = None) -> list[str]:
    """The chunk texts the runner would make of this document with its dataset's settings (or with
    ``settings``, for a change not made yet); parsed in a child process with the workers' limits,
    never in the calling (console) process."""
    if settings is None:
        with Session(ctx.engine) as session:
            settings = ctx.settings_for(stored(session, Dataset, document.dataset_id))
    s = settings
    with ctx.blobs.local_copy(document.blob_key) as path:
        return file_texts(path, media_type=document.media_type, name=document.filename, settings=s)


def file_texts(path: Path, *, media_type: str, name: str, settings: Settings) -> list[str]:
    """The chunk texts of one file under ``settings``, parsed in a child, the workers' limits."""
    s = settings
    parsed = open_document(
        path,
        media_type=media_type,
        max_pages=s.max_pages,
        limits=ParseLimits.from_settings(s),
        name=name,
        ocr=OcrOptions.from_settings(s),
    )
    try:
        return [
            piece
            for _, text in parsed.pages()
            for piece in split_text(text, size=s.chunk_size, overlap=s.chunk_overlap)
        ]
    finally:
        parsed.close()


@dataclass
class _Count:
    chunks: int = 0
    in_index: int = 0
    cached: int = 0
    readable: bool = True


def count_work(
    ctx: Context,
    *,
    document: Document,
    collection: str,
    pipeline_version: str,
    job_id: int | None = None,
    settings: Settings | None = None,
) -> _Count:
    """What running a job of ``pipeline_version`` for ``document`` would do now (chunked with
    ``settings``, by default its dataset's)."""
    try:
        texts = document_texts(ctx, document, settings)
    except Exception as exc:  # missing blob, unreadable file: the job will fail the same way
        log.info("preview: document %s cannot be read: %s", document.id, exc)
        return _Count(readable=False)
    held: set[str] = set()
    if job_id is not None:
        held = set(ctx.vectors.ids_where(collection, {"job_id": job_id}))
    todo = [
        t for i, t in enumerate(texts) if chunk_id(document.sha256, pipeline_version, i) not in held
    ]
    return _Count(
        len(texts),
        len(texts) - len(todo),
        ctx.cache.contains_many(todo, dataset_id=document.dataset_id),
    )


def accumulate(
    counts: Iterable[_Count], *, total_jobs: int, total_documents: int, scale: float | None = None
) -> Preview:
    """Sum the sampled counts and extrapolate them to all jobs: by ``scale`` when the caller knows
    a better factor (say, old chunk counts of all documents over those of the sample), else by the
    number of jobs."""
    p = Preview(jobs=total_jobs, documents=total_documents)
    for c in counts:
        p.sampled += 1
        if not c.readable:
            p.unreadable += 1
            continue
        p.chunks += c.chunks
        p.in_index += c.in_index
        p.cached += c.cached
    if p.sampled and total_jobs > p.sampled:
        factor = scale if scale is not None else total_jobs / p.sampled
        p.chunks, p.in_index, p.cached = (
            round(x * factor) for x in (p.chunks, p.in_index, p.cached)
        )
        p.estimated = True
    p.to_embed = max(0, p.chunks - p.in_index - p.cached)
    return p


def preview_jobs(
    ctx: Context,
    job_ids: Iterable[int],
    *,
    sample: int = SAMPLE,
    budget_seconds: float = BUDGET_SECONDS,
    total_jobs: int | None = None,
    total_documents: int | None = None,
) -> Preview:
    """What retrying (or reindexing) these jobs would cost, counted as the runner will do it. Only
    the first ``sample`` jobs are read; ``total_jobs`` and ``total_documents``, when the caller
    counted them (say, in SQL), stand for all of them, else the ids given do."""
    ids = list(dict.fromkeys(int(i) for i in job_ids))
    found: list[tuple[Job, Document, str]] = []
    with Session(ctx.engine) as session:
        collections = {}
        for jid in ids[:sample]:
            job = get_job(session=session, job_id=jid)  # None also for an id no row can have
            if job is None:
                continue
            doc = stored(session, Document, job.document_id)
            if job.dataset_id not in collections:
                collections[job.dataset_id] = stored(session, Dataset, job.dataset_id).collection
            found.append((job, doc, collections[job.dataset_id]))

    def counts():
        deadline = time.monotonic() + budget_seconds
        for i, (job, doc, coll) in enumerate(found[:sample]):
            if i and time.monotonic() > deadline:
                return  # the rest is extrapolated from what was parsed
            yield count_work(
                ctx,
                document=doc,
                collection=coll,
                pipeline_version=job.pipeline_version,
                job_id=job.id if job.lease else None,
            )

    if total_jobs is None or total_documents is None:
        if len(ids) <= sample:  # all of them were read: count what exists
            jobs_found, documents_found = len(found), len({d.id for _, d, _ in found})
        else:
            with Session(ctx.engine) as session:
                first_job_of = queries.document_ids_of_jobs(session=session, job_ids=ids)
                jobs_found = queries.count_existing_jobs(session=session, job_ids=ids)
            documents_found = len(first_job_of)
        total_jobs = jobs_found if total_jobs is None else total_jobs
        total_documents = documents_found if total_documents is None else total_documents
    return accumulate(counts(), total_jobs=total_jobs, total_documents=total_documents)
