"""Switch documents to the pipeline version in force (``sluice reindex --all``).

Changing the chunking or the model changes the pipeline version, and with it every chunk id. For
each live document whose searchable (active) job was built by another version, a job of the current
version is created (same idempotency key as an upload: ``{dataset_id}:{sha256}:{version}``) and
queued. Its chunks are written beside the old ones; search keeps answering from the old job until
the new one succeeds, then ``sluice.storage.jobs.succeed`` switches the document over in one
transaction and the runner removes the old version's chunks. A document whose new job fails keeps
its old version, searchable as before.

Run the workers with the new settings before reindexing: a worker chunks with its own settings.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from sqlmodel import Session, col, select

from sluice.ops.preview import Preview, accumulate, count_work
from sluice.pipeline.queueing.broker import queue_note
from sluice.pipeline.queueing.publishing import dispatch_now
from sluice.pipeline.running.context import Context
from sluice.storage import jobs
from sluice.storage.db import stored
from sluice.storage.jobs import ActionResult
from sluice.storage.models import Dataset, Document, Job, JobStatus

log = logging.getLogger(__name__)

SAMPLE = 20  # documents parsed for the preview
EACH = "of each dataset"  # the target when datasets with their own parse settings differ
BATCH = 200  # documents per transaction when creating jobs


@dataclass
class Candidate:
    document_id: int
    dataset: str
    filename: str
    active_job_id: int
    from_version: str
    chunk_count: int
    target_job_id: int | None  # an existing job of the new version, if any
    target_status: str | None
    action: str  # create | retry | revive | reindex | underway
    to_version: str = ""  # the version its dataset's settings make now

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class ReindexPlan:
    pipeline_version: str
    documents: int  # documents that get a job of the new version now
    underway: int  # documents whose new-version job is already queued or running
    old_chunks: int  # chunks search serves for those documents today
    preview: Preview
    candidates: list[Candidate] = field(default_factory=list)
    versions: dict[str, str] = field(default_factory=dict)  # each dataset's, when they differ

    def to_dict(self) -> dict:
        return {
            "pipeline_version": self.pipeline_version,
            "versions": self.versions,
            "documents": self.documents,
            "underway": self.underway,
            "old_chunks": self.old_chunks,
            "preview": self.preview.to_dict(),
            "candidates": [c.to_dict() for c in self.candidates],
        }

    def describe(self) -> str:
        target = (
            f"pipeline {self.pipeline_version}"
            if self.pipeline_version != EACH
            else "its dataset's pipeline version"
        )
        if not self.documents:
            text = f"every document is on {target}: nothing to reindex"
            if self.versions and self.pipeline_version == EACH:
                text += " (" + ", ".join(f"{n} {v}" for n, v in sorted(self.versions.items())) + ")"
        else:
            p = self.preview
            about = "about " if p.estimated else ""
            text = (
                f"{self.documents} document(s) to rebuild with {target} "
                f"({self.old_chunks:,} chunk{'' if self.old_chunks == 1 else 's'} today): "
                f"{about}{p.chunks:,} new chunks, {about}{p.cached:,} in the "
                f"embedding cache ({p.cache_hit_rate:.0%}), {about}{p.to_embed:,} to embed"
            )
            if p.unreadable:
                text += f"; {p.unreadable} sampled document(s) cannot be read"
            if p.estimated:
                text += f" (estimated from {p.sampled} parsed document(s))"
        if self.underway:
            text += f"; {self.underway} more already under way"
        return text


@dataclass
class ReindexResult:
    pipeline_version: str
    results: list[ActionResult] = field(default_factory=list)
    underway: int = 0
    queue_error: str | None = None

    @property
    def queued(self) -> int:
        return sum(r.ok for r in self.results)

    @property
    def queue_note(self) -> str:
        """For the operator when publishing the queued jobs failed; empty when it did not."""
        return queue_note(self.queue_error)

    def to_dict(self) -> dict:
        return {
            "pipeline_version": self.pipeline_version,
            "queued": self.queued,
            "underway": self.underway,
            "refused": [asdict(r) for r in self.results if not r.ok],
            "queue_error": self.queue_error,
            "jobs": [r.job_id for r in self.results if r.ok],
        }


def candidates(
    ctx: Context, *, dataset: str | None = None, proposed: Dataset | None = None
) -> list[Candidate]:
    """Live documents whose active, succeeded job is of another pipeline version than their
    dataset's (the process's settings with the dataset's own parse settings). ``proposed``: one
    dataset with parse settings not saved yet (the preview of a change)."""
    out = []
    with Session(ctx.engine) as session:
        stmt = select(Dataset).order_by(col(Dataset.id))
        if dataset:
            stmt = stmt.where(Dataset.name == dataset)
        for ds in [proposed] if proposed is not None else session.exec(stmt).all():
            target = ctx.version_for(ds)
            rows = session.exec(
                select(Document, Job)
                .join(Job, col(Job.id) == Document.active_job_id)
                .where(
                    Document.dataset_id == ds.id,
                    col(Document.deleted_at).is_(None),
                    Job.status == JobStatus.succeeded,
                    Job.pipeline_version != target,
                )
                .order_by(col(Document.id))
            ).all()
            keys = {
                jobs.idempotency_key(
                    dataset_id=ds.id, sha256=doc.sha256, pipeline_version=target
                ): doc.id
                for doc, _ in rows
            }
            existing: dict[int, tuple[int, JobStatus]] = {}
            key_list = list(keys)
            for start in range(0, len(key_list), 500):
                part = key_list[start : start + 500]
                for jid, key, raw_status in session.exec(
                    select(Job.id, Job.idempotency_key, Job.status).where(
                        col(Job.idempotency_key).in_(part)
                    )
                ).all():
                    existing[keys[key]] = (jid, JobStatus(raw_status))
            for doc, job in rows:
                target_id, status = existing.get(doc.id, (None, None))
                out.append(
                    Candidate(
                        document_id=doc.id,
                        dataset=ds.name,
                        filename=doc.filename,
                        active_job_id=job.id,
                        from_version=job.pipeline_version,
                        chunk_count=job.chunk_count or 0,
                        target_job_id=target_id,
                        target_status=status.value if status else None,
                        action=jobs.ACTION_FOR_STATUS[status],
                        to_version=target,
                    )
                )
    return out


def target_version(ctx: Context, dataset: str | None, found: list[Candidate]) -> str:
    """The version a reindex builds: the dataset's, or the process's when every dataset uses it."""
    if dataset:
        with Session(ctx.engine) as session:
            ds = session.exec(select(Dataset).where(Dataset.name == dataset)).first()
        if ds is not None:
            return ctx.version_for(ds)
    versions = {c.to_version for c in found} or set(dataset_versions(ctx).values())
    return versions.pop() if len(versions) == 1 else ctx.pipeline_version if not versions else EACH


def dataset_versions(ctx: Context) -> dict[str, str]:
    """Each dataset's pipeline version (the process's settings with its own parse settings)."""
    with Session(ctx.engine) as session:
        return {ds.name: ctx.version_for(ds) for ds in session.exec(select(Dataset)).all()}


def plan(
    ctx: Context,
    *,
    dataset: str | None = None,
    sample: int = SAMPLE,
    proposed: Dataset | None = None,
) -> ReindexPlan:
    """The preview of ``reindex --all``: documents, about how many chunks, how many from the cache.
    ``proposed``: the same for one dataset under parse settings not saved yet."""
    found = candidates(ctx, dataset=dataset, proposed=proposed)
    settings = ctx.settings_for(proposed) if proposed is not None else None
    todo = [c for c in found if c.action != "underway"]
    with Session(ctx.engine) as session:
        collections = {d.name: d.collection for d in session.exec(select(Dataset)).all()}
        sampled = [(c, stored(session, Document, c.document_id)) for c in todo[:sample]]
        leases = {
            c.target_job_id: stored(session, Job, c.target_job_id).lease
            for c, _ in sampled
            if c.target_job_id
        }
    counts = (
        count_work(
            ctx,
            document=doc,
            collection=collections[c.dataset],
            pipeline_version=c.to_version,
            job_id=c.target_job_id if c.target_job_id and leases.get(c.target_job_id) else None,
            settings=settings,
        )
        for c, doc in sampled
    )
    # Documents differ in size: extrapolate by the chunks they have today, not by their number.
    old_sampled = sum(c.chunk_count for c, _ in sampled)
    old_total = sum(c.chunk_count for c in todo)
    preview = accumulate(
        counts,
        total_jobs=len(todo),
        total_documents=len(todo),
        scale=old_total / old_sampled if old_sampled else None,
    )
    version = (
        ctx.version_for(proposed) if proposed is not None else target_version(ctx, dataset, found)
    )
    return ReindexPlan(
        pipeline_version=version,
        documents=len(todo),
        underway=len(found) - len(todo),
        old_chunks=old_total,
        preview=preview,
        candidates=found,
        versions=dataset_versions(ctx) if version == EACH else {},
    )


def _move_waiting(ctx: Context, *, actor: str, dataset: str | None) -> list[ActionResult]:
    """Each dataset's waiting jobs of another version than its own, moved to its version."""
    moved: list[ActionResult] = []
    with Session(ctx.engine) as session:
        stmt = select(Dataset).order_by(col(Dataset.id))
        if dataset:
            stmt = stmt.where(Dataset.name == dataset)
        for ds in session.exec(stmt).all():
            if ds.deleting_at is not None:
                continue
            version = ctx.version_for(ds)
            moved += jobs.move_waiting(
                session=session,
                dataset_id=ds.id,
                to_version=version,
                actor=actor,
                reason=f"reindex --all to pipeline {version}",
            )
    return moved


def reindex_all(
    ctx: Context,
    *,
    actor: str,
    dataset: str | None = None,
    publish: Callable[[int], None] | None = None,
) -> ReindexResult:
    """Queue a job of the current pipeline version for every document still on another version.
    Jobs of another version that wait to be claimed move first (``jobs.move_waiting``): one that
    waits for a worker of its version would otherwise wait out SLUICE_MAX_OUTAGE_SECONDS, counted
    as under way, before it builds the version in force."""
    moved = _move_waiting(ctx, actor=actor, dataset=dataset)
    found = candidates(ctx, dataset=dataset)
    result = ReindexResult(
        target_version(ctx, dataset, found), underway=sum(c.action == "underway" for c in found)
    )
    result.results.extend(moved)
    todo = [c for c in found if c.action != "underway"]
    for start in range(0, len(todo), BATCH):
        with Session(ctx.engine) as session:
            for c in todo[start : start + BATCH]:
                document = stored(session, Document, c.document_id)
                done, _ = jobs.ensure_version_job(
                    session=session,
                    document=document,
                    pipeline_version=c.to_version,
                    max_attempts=ctx.settings.max_attempts,
                    actor=actor,
                    reason=f"reindex --all to pipeline {c.to_version}",
                )
                result.results.append(done)
    if publish is not None and result.queued:
        result.queue_error = dispatch_now(ctx.engine, via=publish)[0].error
    log.info(
        "reindex --all to %s: %d queued, %d under way",
        result.pipeline_version,
        result.queued,
        result.underway,
    )
    return result
