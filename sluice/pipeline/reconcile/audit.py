"""Reconcile: audit each dataset's Chroma collection against what the job database promises, and
repair it.

Every chunk id says who made it: ``{sha256[:32]}-{pipeline_version}-{position:06d}``, and one job
per dataset has each (sha256, pipeline version) pair (the idempotency key). So a chunk in the store
is, for the job its id names:

- **present**: the job serves search for its document (it is the document's active job, finished)
  and ``position < chunk_count``. Its metadata must name that job, document, version and position,
  and carry the document's file name and metadata as the row has them now (``chunk_copies``: a
  rename by a sync, a metadata change), or it is a **metadata mismatch**.
- **in flight**: the job is pending, running or retrying. A running job's chunks are never touched.
- **kept**: the job is the active one of a document a source's sync tombstoned: out of search, its
  chunks wait for ``sluice sources undo`` until the tombstone time is over. Never touched.
- an **orphan**: no job of this dataset makes the id (a foreign chunk), the job is cancelled,
  failed, superseded or deleted, the document was deleted, or the position is beyond the job's
  chunk count.

Positions of an active job that never showed up are **missing**.

The collection is walked in pages (never all ids in memory): what must be present is a bitmap per
active job, and orphans and mismatches go to a spool file. Because jobs change while the walk runs,
every finding is confirmed against a fresh read of the job database (and missing ids by asking the
store for them directly) before it is reported or repaired.

Repair deletes confirmed orphans, writes the right metadata over mismatched chunks (their vectors
and texts stay), and gives each document with missing chunks a job that rebuilds them: its active
job is reindexed (the re-run adds only the missing ids, with embeddings from the cache), or, when
the settings have moved to another pipeline version since, a job of the current version is queued.
Each change is a JobEvent on the job concerned and a line in the report. A second run finds
nothing.
"""

from __future__ import annotations

import gc
import logging
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator

from sqlmodel import Session, select

from sluice import faults
from sluice.pipeline.queueing.broker import dispatch_now
from sluice.pipeline.reconcile.blob_audit import audit_blobs
from sluice.pipeline.reconcile.changes import ask_changed, changed, fingerprint
from sluice.pipeline.reconcile.lexical_audit import audit_lexical
from sluice.pipeline.reconcile.recall import SAMPLE as INDEX_SAMPLE
from sluice.pipeline.reconcile.recall import check_index
from sluice.pipeline.reconcile.report import DatasetSummary, Finding, ReconcileReport, save_report
from sluice.pipeline.reconcile.snapshot import (
    BATCH,
    SAMPLE,
    PromisedJob,
    Snapshot,
    chunk_standing,
    position,
    unchanged,
    wrong_fields,
)
from sluice.pipeline.running.context import Context
from sluice.storage import jobs, lexical, reconcile_checkpoints
from sluice.storage.clock import db_now
from sluice.storage.db import stored
from sluice.storage.models import Dataset, Document, Job, JobStatus, utcnow
from sluice.storage.reconcile_checkpoints import Checkpoint, Fingerprint
from sluice.storage.vectors import split_chunk_id

log = logging.getLogger(__name__)

PAGE_SIZE = 5000  # chunks per request while walking a collection (larger pages walk faster)
GC_EVERY = 5000  # chunks walked between full garbage collections
SPOOL_MEMORY = 4 * 1024 * 1024  # the spool moves to a temporary file beyond this


# --- the audit ------------------------------------------------------------------------------------


class DatasetAudit:
    """One dataset's audit and repair: the whole collection walked, or (``since`` a checkpoint)
    only the ids of the jobs that changed since, both judged and confirmed by the same code."""

    def __init__(
        self,
        ctx: Context,
        ds: Dataset,
        report: ReconcileReport,
        *,
        repair: bool,
        actor: str,
        page_size: int,
        since: Fingerprint | None = None,
    ) -> None:
        self.ctx, self.ds, self.report, self.repair, self.actor = ctx, ds, report, repair, actor
        self.page_size = page_size
        # The checkpoint of the last repairing pass: read only what changed since (None: walk all).
        self.since = since
        self.first: Snapshot | None = None  # the snapshot judged from, once run
        self.bounds: dict[str, int] | None = None  # the changed prefixes read, once run
        self.summary = DatasetSummary(
            ds.name, ds.collection, kind="full" if since is None else "incremental"
        )
        self.findings: dict[int | None, Finding] = {}
        self.events: dict[int, list[str]] = {}  # job id -> repair notes for its JobEvent
        self.event_data: dict[int, Counter] = {}
        self.late_mismatches: list[str] = []  # found while confirming missing ids
        self.deleted: Counter = Counter()  # document id (None: foreign) -> orphans deleted
        self.fixed: Counter = Counter()  # document id -> chunks whose metadata was rewritten

    # walking
    # ------------------------------------------------------------------------------------------

    def run(self) -> None:
        with Session(self.ctx.engine) as session:
            first = Snapshot(session, self.ds.id)
        self.first = first
        self.bounds = changed(first, self.since).bounds if self.since is not None else None
        jobs = self.summary.jobs = len(first.by_prefix)
        self.summary.jobs_checked = jobs if self.bounds is None else len(self.bounds)
        for prefix, job in first.by_prefix.items():
            if job.expected and (self.bounds is None or prefix in self.bounds):
                count = job.chunk_count or 0  # an expected job has its count
                job.seen = bytearray(count)
                self.summary.expected += count
        with tempfile.SpooledTemporaryFile(
            max_size=SPOOL_MEMORY, mode="w+", encoding="utf-8"
        ) as spool:
            for page in self._walk() if self.bounds is None else self._ask(self.bounds):
                for cid, meta in page:
                    self._judge(first, cid, meta, spool)
                del page  # before the next request: memory is one page's worth
            with Session(self.ctx.engine) as session:
                fresh = Snapshot(session, self.ds.id)
            spool.seek(0)
            self._confirm_spooled(fresh, spool)
        self._confirm_missing(first, fresh)
        # The lexical index, judged the same way (its module builds on this one).

        audit_lexical(self, self.bounds)
        self.summary.disabled = lexical.count_disabled(self.ctx.engine, self.ds.id)
        for start in range(0, len(self.late_mismatches), BATCH):
            self._mismatches(fresh, self.late_mismatches[start : start + BATCH])
        self._summarise_repairs()
        if self.repair:
            self._write_events()
        self.report.datasets.append(self.summary)
        self.report.findings.extend(
            sorted(
                self.findings.values(), key=lambda f: (f.document_id is None, f.document_id or 0)
            )
        )

    def _walk(self) -> Iterator[Iterable[tuple[str, dict | None]]]:
        """The whole collection, page by page: (id, metadata) of each chunk."""
        walked = 0
        for page in self.ctx.vectors.iter_pages(
            self.ds.collection, include=["metadatas"], page_size=self.page_size
        ):
            self.summary.pages += 1
            n = len(page["ids"])
            yield zip(page["ids"], page["metadatas"] or [None] * n, strict=True)
            del page
            walked += n
            if walked >= GC_EVERY:
                # chromadb's client leaves each response in reference cycles (about 0.5 MB per
                # 5,000 chunks): without a full collection they pile up until Python's rare
                # gen-2 pass.
                gc.collect()
                walked = 0

    def _ask(self, bounds: dict[str, int]) -> Iterator[Iterable[tuple[str, dict | None]]]:
        """The changed jobs' ids, asked of the store directly: (id, metadata) of those it holds."""

        def ask(ids: list[str]) -> dict[str, dict | None]:
            got = self.ctx.vectors.get(self.ds.collection, ids, include=["metadatas"])
            return dict(zip(got["ids"], got["metadatas"] or [None] * len(got["ids"]), strict=True))

        for ids, found in ask_changed(bounds, ask):
            self.summary.pages += 1
            self.summary.ids_asked += len(ids)
            yield found.items()

    def _judge(self, first: Snapshot, cid: str, meta: dict | None, spool) -> None:
        """One chunk read, judged against the first snapshot: counted, marked, or spooled to be
        confirmed against a fresh one."""
        self.summary.chunks += 1
        kind, owner, pos, _ = chunk_standing(first, cid)
        if kind == "in_flight":
            self.summary.in_flight += 1
        elif kind == "kept":
            self.summary.kept += 1
        elif kind == "orphan":
            spool.write(f"o\t{cid}\n")
        else:
            # present: a chunk of an expected job, whose positions are being marked
            assert owner is not None and owner.seen is not None
            owner.seen[pos] = 1
            if wrong_fields(owner, pos, meta):
                spool.write(f"m\t{cid}\n")

    def finding(self, snap: Snapshot, document_id: int | None) -> Finding:
        f = self.findings.get(document_id)
        if f is None:
            filename, active = (
                snap.documents.get(document_id, ("", None)) if document_id else ("", None)
            )
            f = self.findings[document_id] = Finding(self.ds.name, document_id, filename, active)
        return f

    def note(self, job_id: int, text: str, **counts: int) -> None:
        self.events.setdefault(job_id, []).append(text)
        self.event_data.setdefault(job_id, Counter()).update(counts)

    # orphans and mismatches
    # ---------------------------------------------------------------------------------

    def _confirm_spooled(self, fresh: Snapshot, spool) -> None:
        orphans: list[str] = []
        mismatched: list[str] = []
        for line in spool:
            tag, cid = line.rstrip("\n").split("\t", 1)
            (orphans if tag == "o" else mismatched).append(cid)
            if len(orphans) >= BATCH:
                self._orphans(fresh, orphans)
                orphans = []
            if len(mismatched) >= BATCH:
                self._mismatches(fresh, mismatched)
                mismatched = []
        self._orphans(fresh, orphans)
        self._mismatches(fresh, mismatched)

    def _orphans(self, fresh: Snapshot, ids: list[str]) -> None:
        doomed: list[str] = []
        per_job: Counter = Counter()
        per_doc: Counter = Counter()
        for cid in ids:
            kind, job, _, why = chunk_standing(fresh, cid)
            if kind != "orphan":
                continue  # its job started or came back while we walked: not an orphan any more
            doomed.append(cid)
            f = self.finding(fresh, job.document_id if job else None)
            f.orphans += 1
            f.orphan_sources[why] = f.orphan_sources.get(why, 0) + 1
            if len(f.orphan_ids) < SAMPLE:
                f.orphan_ids.append(cid)
            per_doc[f.document_id] += 1
            if job is not None:
                per_job[job.id] += 1
        self.summary.orphans += len(doomed)
        if not doomed:
            return
        if self.repair:
            faults.hit("reconcile_before_delete", ids=doomed)
            # Never delete what a job may claim: only ids whose job (or absence of one) is exactly
            # as confirmed. A job retried, revived or created since then reuses its ids.
            with Session(self.ctx.engine) as session:
                before = Snapshot(session, self.ds.id)
            doomed = [cid for cid in doomed if unchanged(fresh, before, cid)]
            if not doomed:
                return
            try:
                self.ctx.vectors.delete(self.ds.collection, ids=doomed)
            except Exception as exc:
                self.report.errors.append(
                    f"{self.ds.name}: deleting {len(doomed)} orphan(s) failed: {exc}"
                )
                return
            self._after_delete(before, doomed)
            for jid, n in per_job.items():
                self.note(jid, f"removed {n} orphan chunk(s)", orphans_removed=n)
            self.deleted.update(per_doc)

    def _after_delete(self, before: Snapshot, deleted: list[str]) -> None:
        """A job that changed while the delete was in flight may have counted on those ids: if it
        now serves search, ask the store for them, and rebuild what is gone."""
        with Session(self.ctx.engine) as session:
            after = Snapshot(session, self.ds.id)
        changed: dict[str, list[str]] = {}
        for cid in deleted:
            parts = split_chunk_id(cid)
            if parts is not None and not unchanged(before, after, cid):  # foreign ids are unchanged
                changed.setdefault(parts[0], []).append(cid)
        for prefix, ids in changed.items():
            job = after.by_prefix.get(prefix)
            if job is None or not job.expected:
                continue  # not serving: its own run checks the index before it may succeed
            ids = [cid for cid in ids if position(cid) < (job.chunk_count or 0)]
            got = (
                set(self.ctx.vectors.get(self.ds.collection, ids, include=[])["ids"])
                if ids
                else set()
            )
            gone = [cid for cid in ids if cid not in got]
            if gone:
                f = self.finding(after, job.document_id)
                f.missing += len(gone)
                f.missing_ids = gone[:SAMPLE]
                self.summary.missing += len(gone)
                self.rebuild(f, job, len(gone))

    def _mismatches(self, fresh: Snapshot, ids: list[str]) -> None:
        if not ids:
            return
        got = self.ctx.vectors.get(self.ds.collection, ids, include=["metadatas"])
        fix_ids, fix_metas = [], []
        per_job: Counter = Counter()
        per_doc: Counter = Counter()
        for cid, meta in zip(got["ids"], got["metadatas"], strict=True):
            kind, job, pos, _ = chunk_standing(fresh, cid)
            if kind != "present" or job is None:
                continue  # an orphan now (the orphan pass of the next run takes it) or in flight
            wrong = wrong_fields(job, pos, meta)
            if not wrong:
                continue
            f = self.finding(fresh, job.document_id)
            f.mismatched += 1
            if len(f.mismatches) < SAMPLE:
                f.mismatches.append({"id": cid, "fields": wrong})
            self.summary.mismatched += 1
            fix_ids.append(cid)
            fix_metas.append({**(meta or {}), **{k: v[1] for k, v in wrong.items()}})
            per_job[job.id] += 1
            per_doc[job.document_id] += 1
        if self.repair and fix_ids:
            try:
                # Only the metadata changes: the vector and text of the id are the job's own.
                self.ctx.vectors.collection(self.ds.collection).update(
                    ids=fix_ids, metadatas=fix_metas
                )
            except Exception as exc:
                self.report.errors.append(
                    f"{self.ds.name}: fixing metadata of {len(fix_ids)} chunk(s) failed: {exc}"
                )
                return
            for jid, n in per_job.items():
                self.note(jid, f"rewrote the metadata of {n} chunk(s)", metadata_fixed=n)
            self.fixed.update(per_doc)

    # missing
    # ----------------------------------------------------------------------------------------------

    def _confirm_missing(self, first: Snapshot, fresh: Snapshot) -> None:
        for prefix, job in first.by_prefix.items():
            if job.seen is None:
                continue
            self.summary.present += len(job.seen) - job.seen.count(0)  # len: its chunk count
            if not job.seen.count(0):
                continue
            now = fresh.by_prefix.get(prefix)
            if (
                now is None
                or not now.expected
                or now.id != job.id
                or now.chunk_count != job.chunk_count
            ):
                # it changed while we walked: not judged this time
                self.summary.expected -= len(job.seen)
                self.summary.present -= len(job.seen) - job.seen.count(0)
                continue
            missing = self._really_missing(prefix, job)
            if not missing:
                continue
            f = self.finding(fresh, job.document_id)
            f.missing += len(missing)
            f.missing_ids = missing[:SAMPLE]
            self.summary.missing += len(missing)
            self.rebuild(f, now, len(missing))

    def _really_missing(self, prefix: str, job: PromisedJob) -> list[str]:
        """Missing positions, asked of the store directly (a walk racing with writes can skip
        ids)."""
        out: list[str] = []
        batch: list[str] = []

        def check() -> None:
            got = self.ctx.vectors.get(self.ds.collection, batch, include=["metadatas"])
            found = dict(zip(got["ids"], got["metadatas"], strict=True))
            for cid in batch:
                if cid not in found:
                    out.append(cid)
                elif wrong_fields(job, position(cid), found[cid]):
                    self.late_mismatches.append(cid)
            batch.clear()

        seen = job.seen or bytearray()  # only a job walked for is asked about: it has its marks
        for pos in range(len(seen)):
            if not seen[pos]:
                batch.append(f"{prefix}{pos:06d}")
                if len(batch) >= BATCH:
                    check()
        if batch:
            check()
        present_late = seen.count(0) - len(out)
        self.summary.present += present_late
        return out

    def rebuild(self, f: Finding, job: PromisedJob, missing: int) -> None:
        target = self.ctx.version_for(self.ds)
        if job.version == target:
            verb = "reindex" if job.status == JobStatus.succeeded else "retry"
            plan = (
                f"{verb} job {job.id}: the re-run adds the {missing} missing chunk(s) from the "
                "embedding cache"
            )
        else:
            plan = (
                f"queue a job of pipeline {target} (job {job.id} was built by "
                f"{job.version}, which the settings no longer make)"
            )
        if not self.repair:
            f.repair.append(plan)
            return
        reason = f"reconcile: {missing} chunk(s) missing from the index"
        with Session(self.ctx.engine) as session:
            if job.version == target:
                fn = jobs.reindex if job.status == JobStatus.succeeded else jobs.retry
                [result] = fn(session=session, job_ids=[job.id], actor=self.actor, reason=reason)
                queued = result.ok
            else:
                document = stored(session, Document, job.document_id)
                result, queued = jobs.ensure_version_job(
                    session=session,
                    document=document,
                    pipeline_version=target,
                    max_attempts=self.ctx.settings.max_attempts,
                    actor=self.actor,
                    reason=reason,
                )
        f.repair.append(result.message)
        self.report.actions.append(f"[{self.ds.name}] document {job.document_id}: {result.message}")
        if queued:
            self.report.queued.append(result.job_id)
        if not result.ok:
            self.report.errors.append(
                f"[{self.ds.name}] document {job.document_id}: {result.message}"
            )

    # what repair did (or would do)
    # ------------------------------------------------------------------------------

    def _summarise_repairs(self) -> None:
        for doc_id, f in self.findings.items():
            lines = []
            if self.repair:
                if self.deleted[doc_id]:
                    lines.append(
                        f"deleted {self.deleted[doc_id]} orphan chunk(s): "
                        f"{', '.join(f.orphan_ids[:3])}"
                        + (" ..." if self.deleted[doc_id] > 3 else "")
                    )
                if self.fixed[doc_id]:
                    lines.append(f"rewrote the metadata of {self.fixed[doc_id]} chunk(s)")
            else:
                if f.orphans:
                    lines.append(f"delete {f.orphans} orphan chunk(s)")
                if f.mismatched:
                    lines.append(
                        f"rewrite the metadata of {f.mismatched} chunk(s) to name their job, "
                        "document, pipeline version and position, and their document's file name "
                        "and metadata"
                    )
            f.repair[:0] = lines
            who = f"document {doc_id}" if doc_id is not None else "foreign chunks"
            if self.repair:
                self.report.actions.extend(f"[{self.ds.name}] {who}: {line}" for line in lines)

    # events
    # ----------------------------------------------------------------------------------------------

    def _write_events(self) -> None:
        if not self.events:
            return
        with Session(self.ctx.engine) as session:
            for jid, notes in self.events.items():
                job = session.get(Job, jid)
                if job is None:
                    continue
                text = "reconcile " + "; ".join(notes)
                jobs.add_event(
                    session,
                    job,
                    "reconcile_repair",
                    actor=self.actor,
                    message=text,
                    data=dict(self.event_data.get(jid, {})),
                )
            session.commit()


def _reconcile_dataset(
    ctx: Context,
    ds: Dataset,
    report: ReconcileReport,
    *,
    repair: bool,
    actor: str,
    page_size: int,
    index_sample: int,
    changed_only: bool,
    full_every_hours: float | None,
) -> None:
    """One dataset's pass, full or over what changed; a repairing pass that added no error saves
    the dataset's checkpoint."""
    errors = len(report.errors)
    with Session(ctx.engine) as session:
        checkpoint = reconcile_checkpoints.load(session, ds.id)
        why_full = (
            _why_full(checkpoint, ds, full_every_hours, db_now(session)) if changed_only else ""
        )
    incremental = changed_only and checkpoint is not None and not why_full
    index = None
    if not incremental:
        ds, index = check_index(
            ctx,
            ds,
            repair=repair,
            actions=report.actions,
            errors=report.errors,
            sample=index_sample,
        )
    audit = DatasetAudit(
        ctx,
        ds,
        report,
        repair=repair,
        actor=actor,
        page_size=page_size,
        since=checkpoint.entries if incremental and checkpoint else None,
    )
    audit.summary.why_full = why_full
    audit.run()
    if index is not None:
        report.datasets[-1].index = index.to_dict()
        report.datasets[-1].index_text = index.describe()
    if repair and len(report.errors) == errors and audit.first is not None:
        with Session(ctx.engine) as session:
            reconcile_checkpoints.save(
                session,
                ds.id,
                ds.collection,
                fingerprint(audit.first, checkpoint.entries if checkpoint else None),
                full=not incremental,
                actor=actor,
            )


def _blobs_or_note(ctx: Context, report: ReconcileReport, dataset: str | None) -> None:
    """The blob audit after a full pass; after an incremental one, the note of what it skipped."""
    if report.kind == "incremental":
        report.notes.append(INCREMENTAL_NOTE)
        return
    try:
        audit_blobs(ctx, report, dataset)
    except Exception as exc:  # the blob store does not answer: say so, keep the index audit
        log.exception("blob audit failed")
        report.errors.append(f"blob store: {type(exc).__name__}: {exc}")


def reconcile(
    ctx: Context,
    *,
    repair: bool = False,
    actor: str = "system",
    dataset: str | None = None,
    publish: Callable[[int], None] | None = None,
    page_size: int = PAGE_SIZE,
    save: bool = True,
    index_sample: int = INDEX_SAMPLE,
    changed_only: bool = False,
    full_every_hours: float | None = None,
) -> ReconcileReport:
    """Audit (and with ``repair`` fix) every dataset, or the one named; returns the report.

    Jobs that repair queues are written to the outbox; ``publish`` dispatches them now, otherwise
    the workers' recovery loop publishes them within seconds. ``changed_only``: per dataset, an
    incremental pass over the jobs that changed since its checkpoint (``changes``), or a full one
    when it has none, its collection is another, or its last full pass is older than
    ``full_every_hours``. A repairing pass that ended without errors saves the checkpoint.
    """
    started = time.monotonic()
    report = ReconcileReport(
        repair=repair,
        actor=actor,
        started_at=utcnow().isoformat(),
        scope=dataset,
        changed_only=changed_only,
    )
    with Session(ctx.engine) as session:
        stmt = select(Dataset).order_by(Dataset.name)
        if dataset:
            stmt = stmt.where(Dataset.name == dataset)
        datasets = list(session.exec(stmt).all())
    if dataset and not datasets:
        report.errors.append(f"no dataset named {dataset!r}")
    for ds in datasets:
        try:
            _reconcile_dataset(
                ctx,
                ds,
                report,
                repair=repair,
                actor=actor,
                page_size=page_size,
                index_sample=index_sample,
                changed_only=changed_only,
                full_every_hours=full_every_hours,
            )
        except Exception as exc:  # one unreachable collection must not hide the others
            log.exception("reconcile of dataset %s failed", ds.name)
            report.errors.append(f"{ds.name}: {type(exc).__name__}: {exc}")
    _blobs_or_note(ctx, report, dataset)
    if repair and publish is not None and report.queued:
        note = dispatch_now(ctx.engine, via=publish)[1]
        if note:
            report.errors.append(note)
    report.seconds = round(time.monotonic() - started, 3)
    report.finished_at = utcnow().isoformat()
    log.info(
        "reconcile (repair=%s, %s, by %s): %d chunks, %d missing, %d orphans, %d mismatched in "
        "%.1fs",
        repair,
        report.kind,
        actor,
        report.chunks,
        report.missing,
        report.orphans,
        report.mismatched,
        report.seconds,
    )
    if save:
        save_report(ctx, report)
    return report


INCREMENTAL_NOTE = (
    "an incremental pass reads only the chunks of the jobs that changed since the last repairing "
    "pass; chunks added or removed behind Sluice's back for jobs that did not change, foreign "
    "chunks, the recall sample and the blob audit are for a full pass (`sluice reconcile` without "
    "--changed)"
)


def _why_full(
    checkpoint: Checkpoint | None, ds: Dataset, full_every_hours: float | None, now
) -> str:
    """Why a pass asked to be incremental walks the whole collection ('' when it need not)."""
    if checkpoint is None:
        return "no checkpoint yet: no repairing pass of this dataset ended without errors"
    if checkpoint.collection != ds.collection:
        return "its collection is another since the last pass (rebuilt)"
    if full_every_hours is not None and checkpoint.full_older_than(full_every_hours, now):
        if checkpoint.full_at is None:
            return "no full pass has saved a checkpoint yet"
        return f"the last full pass is older than {full_every_hours:g} h"
    return ""


# --- the last report, for the console -------------------------------------------------------------
