"""Sources that stay in sync: a folder or an S3 prefix a dataset follows.

A sync lists the source, reads again only the files whose size or time moved, and compares their
sha256 with what it recorded (``sluice.storage.source_records``): new files are uploaded under
their source-relative path as external id, changed ones become a new version of their document
(the old one serves until the new one succeeds), a file gone whose bytes show up under a new path
is a rename (its entry moves; nothing is embedded), and files gone from a complete listing are
tombstoned: their documents leave search at once and keep their bytes and chunks for
``SLUICE_SYNC_TOMBSTONE_HOURS`` (``undo`` brings them back without embedding), then are removed
for good. A listing that failed or came back empty, or a sync that would remove more than
``SLUICE_SYNC_MAX_REMOVE_FRACTION`` of the source's documents, removes nothing until confirmed.

The sync carries out the plan its preview shows (``plan.make_plan``, through
``previewing.plan_source``), each file's step as soon as it is planned. One sync of a source runs
at a time across the fleet (a lease with a fencing token, renewed by every write); a sync killed
halfway leaves what it wrote, and the next one goes on from there.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlmodel import Session, col, select

from sluice import faults
from sluice.errors import OperationError
from sluice.ops import documents, ingest
from sluice.ops.documents import delete_document
from sluice.ops.sources.listing import parse_s3
from sluice.ops.sources.plan import RENAME, RESTORE, TOUCH, Plan, Step, SyncResult
from sluice.ops.sources.previewing import plan_source, preview_sync
from sluice.pipeline.running.context import Context
from sluice.storage import source_records as records
from sluice.storage import webhook_records
from sluice.storage.clock import as_utc, db_now
from sluice.storage.db import ensure_dataset
from sluice.storage.models import Dataset, Document, Job, JobStatus
from sluice.storage.source_records import Source, SourceEntry, SourceRun

log = logging.getLogger(__name__)

LEASE_SECONDS = 120.0  # renewed by every write of the sync; a dead holder's lease runs out
NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")
NAME_RULE = "A source name is 1 to 64 lower-case letters, digits, '.', '_' or '-'."
EVERY = re.compile(r"^(\d+)\s*([smhd])$")
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


class SourceError(OperationError):
    """A source request refused: ``code`` says which rule, ``status`` the API's answer."""

    code, status = "bad_source", 422
    hint = "Name one folder on this host or one s3://bucket/prefix (sluice sources add --help)."


class UnknownSource(SourceError):
    code, status = "unknown_source", 404
    hint = "See the sources' names with `sluice sources list` (or GET /v1/sources)."


class SourceExists(SourceError):
    code, status = "source_exists", 409
    hint = "Choose another name, or remove the old source first (sluice sources remove NAME)."


class SourceLeaseLost(RuntimeError):
    """Another sync took this source's lease: this one writes nothing more."""


# -- sources --------------------------------------------------------------------------------------


@dataclass
class SourceView:
    name: str
    dataset: str
    kind: str
    location: str
    include: list[str]
    exclude: list[str]
    every_seconds: int | None
    next_run_at: str | None
    documents: int = 0
    tombstoned: int = 0
    last_run: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def parse_every(text: str | None) -> int | None:
    """``15m`` -> 900 (s, m, h, d); None or "" -> None; at least a minute."""
    if not text:
        return None
    m = EVERY.match(text.strip().lower())
    if not m or int(m.group(1)) * UNITS[m.group(2)] < 60:
        raise SourceError(
            f"{text!r} is not an interval of at least a minute (e.g. 15m, 1h, 1d)",
            code="bad_every",
            hint="Write a number and a unit of s, m, h or d, a minute or more: 15m, 1h, 1d.",
        )
    return int(m.group(1)) * UNITS[m.group(2)]


def add_source(
    ctx: Context,
    *,
    name: str,
    dataset: str,
    folder: str | None = None,
    s3: str | None = None,
    include: list[str] | None = None,
    exclude: list[str] | None = None,
    every: str | int | None = None,
    actor: str = "system",
) -> SourceView:
    """A new source of ``dataset`` (made if need be): ``folder`` or ``s3``, synced every ``every``
    (``15m``) by the workers, or only when asked."""
    if not NAME.match(name or ""):
        raise SourceError(
            f"{name!r} is not a source name. {NAME_RULE}", code="bad_source_name", hint=NAME_RULE
        )
    if not ingest.DATASET_NAME.match(dataset or ""):
        raise SourceError(
            f"{dataset!r}: {ingest.DATASET_NAME_RULE}",
            code="bad_dataset_name",
            hint=ingest.DATASET_NAME_RULE,
        )
    if (folder is None) == (s3 is None):
        raise SourceError("name exactly one of a folder or an s3://bucket/prefix")
    if folder is not None:
        kind, location = "folder", os.path.abspath(os.path.expanduser(folder))
        if not os.path.isdir(location):
            raise SourceError(f"{folder!r} is not a folder on this host")
    else:
        kind, location = "s3", str(s3)
        try:
            bucket, _ = parse_s3(location)
        except ValueError as exc:
            raise SourceError(str(exc)) from None
        if ctx.settings.blob_store == "s3" and bucket == ctx.settings.s3_bucket:
            raise SourceError(
                "that bucket is Sluice's own blob store: it holds every dataset's uploads",
                code="source_location_refused",
                hint="Name a bucket of the files to follow, not SLUICE_S3_BUCKET.",
            )
    seconds = every if isinstance(every, int) else parse_every(every)
    with Session(ctx.engine) as session:
        if records.by_name(session, name) is not None:
            raise SourceExists(f"a source named {name!r} exists already")
        ds = ensure_dataset(session=session, name=dataset)
        session.add(
            Source(
                name=name,
                dataset_id=ds.id,
                kind=kind,
                location=location,
                include=list(include or []),
                exclude=list(exclude or []),
                every_seconds=seconds,
                created_by=actor,
                next_run_at=db_now(session) if seconds else None,
            )
        )
        session.commit()
    log.info("source %s (%s %s -> %s) added by %s", name, kind, location, dataset, actor)
    return get_source(ctx, name)


def _source(session: Session, name: str) -> Source:
    src = records.by_name(session, name)
    if src is None:
        raise UnknownSource(f"no source named {name!r} (sluice sources list)")
    return src


def _view(session: Session, src: Source) -> SourceView:
    ds = session.get(Dataset, src.dataset_id)
    rows = records.entries(session, src.id)
    run = records.last_run(session, src.id)
    return SourceView(
        name=src.name,
        dataset=ds.name if ds else "?",
        kind=src.kind,
        location=src.location,
        include=list(src.include or []),
        exclude=list(src.exclude or []),
        every_seconds=src.every_seconds,
        next_run_at=src.next_run_at.isoformat() if src.next_run_at else None,
        documents=sum(1 for r in rows if r.removed_at is None),
        tombstoned=sum(1 for r in rows if r.removed_at is not None),
        last_run=records.run_counts(run) if run else None,
    )


def get_source(ctx: Context, name: str) -> SourceView:
    with Session(ctx.engine) as session:
        return _view(session, _source(session, name))


def list_sources(ctx: Context) -> list[SourceView]:
    with Session(ctx.engine) as session:
        return [_view(session, s) for s in records.all_sources(session)]


def remove_source(
    ctx: Context, name: str, *, keep_documents: bool = False, actor: str = "system"
) -> str:
    """Forget a source; its documents are deleted too unless ``keep_documents``."""
    with Session(ctx.engine) as session:
        src = _source(session, name)
        rows = records.entries(session, src.id)
        doc_ids = sorted({r.document_id for r in rows if r.document_id is not None})
        for row in rows:
            session.delete(row)
        for run in session.exec(select(SourceRun).where(SourceRun.source_id == src.id)).all():
            session.delete(run)
        lease = records.lease_of(session, src.id)
        if lease is not None:
            session.delete(lease)
        session.delete(src)
        session.commit()
    deleted = 0
    if not keep_documents:
        for doc_id in doc_ids:
            done = delete_document(ctx, f"doc:{doc_id}", actor=actor, reason="source removed")
            deleted += done.ok
    kept = f"{len(doc_ids)} document(s) " + ("kept" if keep_documents else f"deleted: {deleted}")
    log.info("source %s removed by %s (%s)", name, actor, kept)
    return f"source {name} removed; {kept}"


# -- a sync ---------------------------------------------------------------------------------------


def _holder() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}"[:120]


def sync(
    ctx: Context,
    name: str,
    *,
    actor: str = "system",
    preview: bool = False,
    confirm: bool = False,
    publish: Callable[[int], None] | None = None,
) -> SyncResult:
    """Sync one source now (or only show what a sync would do: ``preview``)."""
    with Session(ctx.engine, expire_on_commit=False) as session:
        src = _source(session, name)
        ds = session.get(Dataset, src.dataset_id)
    assert ds is not None
    if preview:
        return preview_sync(ctx, src, ds, confirm=confirm)
    with Session(ctx.engine) as session:
        token = records.take_lease(
            session, source_id=src.id, holder=_holder(), seconds=LEASE_SECONDS
        )
        if token is None:
            lease = records.lease_of(session, src.id)
            holder = lease.holder if lease else "another process"
            return SyncResult(
                name, False, status="busy", message=f"a sync of {name} is running ({holder})"
            )
        records.mark_interrupted(session, src.id)
        run = SourceRun(source_id=src.id, actor=actor, started_at=db_now(session))
        session.add(run)
        session.commit()
        run_id = run.id
    job = _Sync(ctx, src, ds, token, run_id, confirm=confirm, publish=publish)
    try:
        return job.run()
    except SourceLeaseLost:
        return job.finish("interrupted", "the lease was taken by another sync; this one stopped")
    finally:
        with Session(ctx.engine) as session:
            records.release_lease(session, source_id=src.id, token=token)


class _Sync:
    """One running sync: carries out each step of its plan under the lease, then the removals."""

    def __init__(
        self,
        ctx: Context,
        src: Source,
        ds: Dataset,
        token: int,
        run_id: int,
        *,
        confirm: bool,
        publish: Callable[[int], None] | None,
    ) -> None:
        self.ctx, self.src, self.ds, self.token, self.run_id = ctx, src, ds, token, run_id
        self.confirm, self.publish = confirm, publish
        self.plan = Plan()  # filled as the sync goes: one stopped halfway reports what it did

    def run(self) -> SyncResult:
        plan = plan_source(
            self.ctx, self.src, confirm=self.confirm, carry_out=self._carry_out, into=self.plan
        )
        self._tombstone(plan.remove)
        purge_expired(self.ctx)
        status = "failed" if plan.error is not None else "held" if plan.held else "done"
        return self.finish(status, plan.describe())

    def _carry_out(self, step: Step, data: bytes) -> str | None:
        """One step of the plan, under the lease; why it was refused, if it was."""
        refused = None
        if step.action == TOUCH:
            self._write(step, keep=True)
        elif step.action == RESTORE:
            self._write(step, keep=True, restore=True)
        elif step.action == RENAME:
            self._rename(step)
        else:
            refused = self._ingest(step, data)
        faults.hit("source_applied", source=self.src.name, path=step.path)
        return refused

    def _fence(self, session: Session) -> None:
        if not records.renew_lease(
            session, source_id=self.src.id, token=self.token, seconds=LEASE_SECONDS
        ):
            session.rollback()
            raise SourceLeaseLost(self.src.name)

    def _ingest(self, step: Step, data: bytes) -> str | None:
        """Upload an added or changed file under its path as external id (a change becomes a new
        version of its document); why ingest refused it, if it did."""
        got = ingest.ingest_bytes(
            self.ctx,
            data,
            dataset=self.ds.name,
            filename=step.path.rsplit("/", 1)[-1],
            actor=f"source:{self.src.name}",
            publish=self.publish,
            external_id=step.path,
        )
        if not got.accepted:
            return f"{got.error_code}: {got.message}"
        self._write(step, document_id=got.document_id, job_id=got.job_id)
        return None

    def _write(
        self,
        step: Step,
        *,
        keep: bool = False,
        restore: bool = False,
        document_id: int | None = None,
        job_id: int | None = None,
    ) -> None:
        """Record one file as read (under the lease); ``keep`` its document, or name the new one."""
        seen = step.seen
        with Session(self.ctx.engine) as session:
            self._fence(session)
            row = _entry(session, self.src.id, step.path)
            if row is None:
                row = SourceEntry(
                    source_id=self.src.id, path=step.path, size=0, mtime_ns=0, sha256=step.sha256
                )
            row.size, row.mtime_ns, row.etag = seen.size, seen.mtime_ns, seen.etag
            row.sha256 = step.sha256
            row.updated_at = db_now(session)
            if not keep:
                row.document_id, row.job_id = document_id, job_id
            if restore or not keep:
                row.removed_at = None
                if row.document_id is not None:
                    _show(session, [row.document_id])
            session.add(row)
            session.commit()

    def _rename(self, step: Step) -> None:
        """Move an entry to its new path: the same document, its external id and name moved."""
        old, new, seen = step.old, step.path, step.seen
        with Session(self.ctx.engine) as session:
            self._fence(session)
            stale = _entry(session, self.src.id, new)  # a tombstone under the new path
            if stale is not None:
                session.delete(stale)
                session.flush()
            row = _entry(session, self.src.id, old)
            assert row is not None
            row.path, row.size, row.mtime_ns, row.etag = new, seen.size, seen.mtime_ns, seen.etag
            row.updated_at = db_now(session)
            session.add(row)
            doc = session.get(Document, row.document_id) if row.document_id else None
            if doc is not None:
                doc.filename = ingest.sanitize_filename(new)
                if doc.external_id == old:
                    doc.external_id = new
                session.add(doc)
            session.commit()

    def _tombstone(self, paths: list[str]) -> None:
        if not paths:
            return
        # The version serving under each path too (a replacement that failed leaves it serving
        # while the entry names the failed one).
        serving = [documents.find_by_external_id(self.ctx, self.ds.name, p) for p in paths]
        with Session(self.ctx.engine) as session:
            self._fence(session)
            now = db_now(session)
            hide: set[int] = set()
            for path in paths:
                row = _entry(session, self.src.id, path)
                if row is None:
                    continue
                row.removed_at = now
                session.add(row)
                if row.document_id is not None:
                    hide.add(row.document_id)
            hide.update(d for d in serving if d is not None)
            session.flush()
            _hide(session, [d for d in hide if not _live_refs(session, d)], now)
            session.commit()

    def finish(self, status: str, message: str) -> SyncResult:
        """Record the run's end (its counts, the next run's time, the webhook event)."""
        plan = self.plan
        counts = plan.counts()
        with Session(self.ctx.engine) as session:
            run = session.get(SourceRun, self.run_id)
            assert run is not None
            run.status, run.message = status, message
            run.finished_at = db_now(session)
            run.listed, run.unchanged = plan.listed, plan.unchanged + len(plan.touch)
            run.added, run.changed, run.renamed = len(plan.add), len(plan.change), len(plan.rename)
            run.removed, run.held, run.failed = len(plan.remove), len(plan.held), len(plan.failed)
            run.counts = {**counts, "failures": plan.failed[:50]}
            src = session.get(Source, self.src.id)
            if src is not None and src.every_seconds:
                src.next_run_at = run.finished_at + timedelta(seconds=src.every_seconds)
                session.add(src)
            session.add(run)
            webhook_records.record_synced(session, source=self.src, run=run, dataset=self.ds.name)
            session.commit()
            seconds = (run.finished_at - as_utc(run.started_at)).total_seconds()
        if plan.failed:
            message += f"; {len(plan.failed)} file(s) could not be read or were refused"
        log.info("source %s synced (%s): %s", self.src.name, status, message)
        return SyncResult(
            self.src.name,
            True,
            status=status,
            run_id=self.run_id,
            counts=counts,
            failed=plan.failed,
            held_reason=plan.held_reason,
            message=message,
            seconds=round(seconds, 3),
        )


def _entry(session: Session, source_id: int, path: str) -> SourceEntry | None:
    return session.exec(
        select(SourceEntry).where(SourceEntry.source_id == source_id, SourceEntry.path == path)
    ).first()


def _live_refs(session: Session, document_id: int) -> int:
    """Entries of any source that still name this document as a live file."""
    return len(
        session.exec(
            select(SourceEntry.id).where(
                SourceEntry.document_id == document_id, col(SourceEntry.removed_at).is_(None)
            )
        ).all()
    )


def _hide(session: Session, document_ids: list[int], now: datetime) -> None:
    """Tombstoned documents leave search at once (search serves live documents only); their
    jobs, chunks and bytes stay."""
    for doc_id in document_ids:
        doc = session.get(Document, doc_id)
        if doc is not None and doc.deleted_at is None:
            doc.deleted_at = now
            session.add(doc)


def _show(session: Session, document_ids: list[int]) -> None:
    for doc_id in document_ids:
        doc = session.get(Document, doc_id)
        if doc is not None and doc.deleted_at is not None and doc.active_job_id is not None:
            if _still_there(session, doc):
                doc.deleted_at = None
                session.add(doc)


def _still_there(session: Session, doc: Document) -> bool:
    """A tombstoned document comes back only while its jobs were not deleted for good."""
    job = session.get(Job, doc.active_job_id)
    return job is not None and job.status == JobStatus.succeeded


# -- tombstones -----------------------------------------------------------------------------------


def undo(ctx: Context, name: str, *, actor: str = "system") -> str:
    """Bring back what the source's syncs tombstoned (within the tombstone time): its documents
    serve again from the chunks they kept; nothing is embedded."""
    with Session(ctx.engine) as session:
        src = _source(session, name)
        rows = [r for r in records.entries(session, src.id) if r.removed_at is not None]
        for row in rows:
            row.removed_at = None
            session.add(row)
        session.flush()
        _show(session, sorted({r.document_id for r in rows if r.document_id is not None}))
        session.commit()
    log.info("source %s: %d tombstoned file(s) brought back by %s", name, len(rows), actor)
    return f"{len(rows)} tombstoned document(s) of {name} are back in search (nothing embedded)"


def purge_expired(ctx: Context) -> int:
    """Remove for good what was tombstoned longer than SLUICE_SYNC_TOMBSTONE_HOURS ago."""
    hours = ctx.settings.sync_tombstone_hours
    with Session(ctx.engine) as session:
        cutoff = db_now(session) - timedelta(hours=hours)
        rows = session.exec(
            select(SourceEntry).where(col(SourceEntry.removed_at).is_not(None))
        ).all()
        due = [r for r in rows if r.removed_at is not None and as_utc(r.removed_at) <= cutoff]
        doc_ids = {r.document_id for r in due if r.document_id is not None}
        for row in due:
            session.delete(row)
        session.commit()
        doc_ids = {d for d in doc_ids if not _live_refs(session, d)}
    for doc_id in sorted(doc_ids):
        delete_document(ctx, f"doc:{doc_id}", actor="source tombstone", reason="tombstone expired")
    return len(due)


def metric_families(ctx: Context) -> list:
    """Prometheus families of the sources (``sluice.ops.metrics``): each source's documents and
    what its last sync did, how long it took and when it ended."""
    from prometheus_client.core import GaugeMetricFamily

    docs = GaugeMetricFamily(
        "sluice_source_documents", "Live documents of each source", labels=["source", "dataset"]
    )
    files = GaugeMetricFamily(
        "sluice_source_last_sync_files",
        "What the last sync of each source did, by kind of change",
        labels=["source", "change"],
    )
    took = GaugeMetricFamily(
        "sluice_source_last_sync_seconds", "How long the last sync took", labels=["source"]
    )
    ended = GaugeMetricFamily(
        "sluice_source_last_sync_timestamp_seconds",
        "When the last sync ended (unix time)",
        labels=["source"],
    )
    for v in list_sources(ctx):
        docs.add_metric([v.name, v.dataset], v.documents)
        run = v.last_run
        if not run or not run.get("finished_at"):
            continue
        for change in ("added", "changed", "renamed", "removed", "failed", "held", "unchanged"):
            files.add_metric([v.name, change], run[change])
        finish = datetime.fromisoformat(run["finished_at"])
        start = datetime.fromisoformat(run["started_at"])
        took.add_metric([v.name], (as_utc(finish) - as_utc(start)).total_seconds())
        ended.add_metric([v.name], as_utc(finish).timestamp())
    return [docs, files, took, ended]
