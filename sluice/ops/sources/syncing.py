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

One sync of a source runs at a time across the fleet (a lease with a fencing token, renewed by
every write); a sync killed halfway leaves what it wrote, and the next one goes on from there.
"""

from __future__ import annotations

import hashlib
import inspect
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
from sluice.ops import documents, ingest
from sluice.ops.documents import delete_document
from sluice.ops.sources.listing import Listing, Seen, SourceReader, parse_s3, reader_for
from sluice.ops.sources.plan import Known, Plan, SyncResult, classify, gone, guard, to_read
from sluice.ops.sources.previewing import known_entries, preview_sync
from sluice.pipeline.running.context import Context
from sluice.storage import source_records as records
from sluice.storage.clock import db_now
from sluice.storage.db import ensure_dataset
from sluice.storage.models import Dataset, Document
from sluice.storage.source_records import Source, SourceEntry, SourceRun

log = logging.getLogger(__name__)

LEASE_SECONDS = 120.0  # renewed by every write of the sync; a dead holder's lease runs out
NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")
NAME_RULE = "A source name is 1 to 64 lower-case letters, digits, '.', '_' or '-'."
EVERY = re.compile(r"^(\d+)\s*([smhd])$")
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
# Issue 28's external ids: pass the path as the document's external id where ingest takes one.
TAKES_EXTERNAL_ID = "external_id" in inspect.signature(ingest.ingest_bytes).parameters


class SourceError(ValueError):
    """A source request that cannot be done: ``code`` is stable (the API's problem code)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class LeaseLost(RuntimeError):
    """Another holder took this source's lease: this sync writes nothing more."""


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
            "bad_every", f"{text!r} is not an interval of at least a minute (e.g. 15m, 1h, 1d)"
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
    records.ensure_tables(ctx.engine)
    if not NAME.match(name or ""):
        raise SourceError("bad_source_name", f"{name!r} is not a source name. {NAME_RULE}")
    if not ingest.DATASET_NAME.match(dataset or ""):
        raise SourceError("bad_dataset_name", f"{dataset!r}: {ingest.DATASET_NAME_RULE}")
    if (folder is None) == (s3 is None):
        raise SourceError("bad_source", "name exactly one of a folder or an s3://bucket/prefix")
    if folder is not None:
        kind, location = "folder", os.path.abspath(os.path.expanduser(folder))
        if not os.path.isdir(location):
            raise SourceError("bad_source", f"{folder!r} is not a folder on this host")
    else:
        kind, location = "s3", str(s3)
        try:
            parse_s3(location)
        except ValueError as exc:
            raise SourceError("bad_source", str(exc)) from None
    seconds = every if isinstance(every, int) else parse_every(every)
    with Session(ctx.engine) as session:
        if records.by_name(session, name) is not None:
            raise SourceError("source_exists", f"a source named {name!r} exists already")
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
        raise SourceError("unknown_source", f"no source named {name!r} (sluice sources list)")
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
    records.ensure_tables(ctx.engine)
    with Session(ctx.engine) as session:
        return _view(session, _source(session, name))


def list_sources(ctx: Context) -> list[SourceView]:
    records.ensure_tables(ctx.engine)
    with Session(ctx.engine) as session:
        return [_view(session, s) for s in records.all_sources(session)]


def remove_source(
    ctx: Context, name: str, *, keep_documents: bool = False, actor: str = "system"
) -> str:
    """Forget a source; its documents are deleted too unless ``keep_documents``."""
    records.ensure_tables(ctx.engine)
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
    records.ensure_tables(ctx.engine)
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
    job = _Sync(ctx, src, ds, token, run_id, actor=actor, confirm=confirm, publish=publish)
    try:
        return job.run()
    except LeaseLost:
        return job.finish("interrupted", "the lease was taken by another sync; this one stopped")
    finally:
        with Session(ctx.engine) as session:
            records.release_lease(session, source_id=src.id, token=token)


class _Sync:
    """One running sync: reads, applies each file's change under the lease, then the removals."""

    def __init__(
        self,
        ctx: Context,
        src: Source,
        ds: Dataset,
        token: int,
        run_id: int,
        *,
        actor: str,
        confirm: bool,
        publish: Callable[[int], None] | None,
    ) -> None:
        self.ctx, self.src, self.ds, self.token, self.run_id = ctx, src, ds, token, run_id
        self.actor, self.confirm, self.publish = actor, confirm, publish
        self.plan = Plan()
        self.failed: list[dict[str, str]] = []
        self.started = db_now_of(ctx)

    def run(self) -> SyncResult:
        reader = reader_for(
            self.src.kind, self.src.location, self.src.include, self.src.exclude, self.ctx.settings
        )
        listing = reader.listing()
        faults.hit("source_listed", source=self.src.name)
        with Session(self.ctx.engine) as session:
            known = known_entries(session, self.src.id)
        plan = self.plan
        plan.listed, plan.live = len(listing.files), sum(1 for k in known.values() if not k.removed)
        reading = to_read(listing.files, known)
        plan.unchanged = len(listing.files) - len(reading)
        missing = [] if listing.error else gone(listing.files, known)
        by_sha: dict[str, list[str]] = {}
        for path in missing:
            by_sha.setdefault(known[path].sha256, []).append(path)
        for path in reading:
            self._one(reader, path, known, by_sha)
            faults.hit("source_applied", source=self.src.name, path=path)
        renamed = {old for old, _ in plan.rename}
        plan.remove = [p for p in missing if p not in renamed]
        max_fraction = self.ctx.settings.sync_max_remove_fraction
        guard(plan, error=listing.error, max_fraction=max_fraction, confirmed=self.confirm)
        self._tombstone(plan.remove)
        purge_expired(self.ctx)
        status = "failed" if listing.error else "held" if plan.held else "done"
        return self.finish(status, plan.describe(), listing)

    def _one(self, reader: SourceReader, path: str, known: dict[str, Known], by_sha) -> None:
        try:
            data, seen = reader.read(path, max_bytes=self.ctx.settings.max_upload_bytes)
        except OSError as exc:
            self.failed.append({"path": path, "error": str(exc)})
            return
        sha = hashlib.sha256(data).hexdigest()
        what = classify(path, sha, known, by_sha)
        if what == "touch":
            self._write(path, seen, sha, keep=True)
            self.plan.touch.append(path)
        elif what == "restore":
            self._write(path, seen, sha, keep=True, restore=True)
            self.plan.restore.append(path)
        elif what.startswith("rename:"):
            old = what[len("rename:") :]
            self._rename(old, path, seen)
            self.plan.rename.append((old, path))
        else:
            if self._ingest(path, data, seen, sha, changed=what == "change"):
                (self.plan.change if what == "change" else self.plan.add).append(path)

    def _fence(self, session: Session) -> None:
        if not records.renew_lease(
            session, source_id=self.src.id, token=self.token, seconds=LEASE_SECONDS
        ):
            session.rollback()
            raise LeaseLost(self.src.name)

    def _ingest(self, path: str, data: bytes, seen: Seen, sha: str, *, changed: bool) -> bool:
        extra: dict[str, Any] = {"external_id": path} if TAKES_EXTERNAL_ID else {}
        got = ingest.ingest_bytes(
            self.ctx,
            data,
            dataset=self.ds.name,
            filename=path.rsplit("/", 1)[-1],
            actor=f"source:{self.src.name}",
            publish=self.publish,
            **extra,
        )
        if not got.accepted:
            self.failed.append({"path": path, "error": f"{got.error_code}: {got.message}"})
            return False
        old = self._write(path, seen, sha, document_id=got.document_id, job_id=got.job_id)
        if old is not None and old != got.document_id and not TAKES_EXTERNAL_ID:
            self._drop_unused(old)  # without external ids the old document goes by hand
        return True

    def _write(
        self,
        path: str,
        seen: Seen,
        sha: str,
        *,
        keep: bool = False,
        restore: bool = False,
        document_id: int | None = None,
        job_id: int | None = None,
    ) -> int | None:
        """Record one file as read (under the lease); the document it named before."""
        with Session(self.ctx.engine) as session:
            self._fence(session)
            row = session.exec(
                select(SourceEntry).where(
                    SourceEntry.source_id == self.src.id, SourceEntry.path == path
                )
            ).first()
            before = row.document_id if row is not None else None
            if row is None:
                row = SourceEntry(source_id=self.src.id, path=path, size=0, mtime_ns=0, sha256=sha)
            row.size, row.mtime_ns, row.etag, row.sha256 = seen.size, seen.mtime_ns, seen.etag, sha
            row.updated_at = db_now(session)
            if not keep:
                row.document_id, row.job_id = document_id, job_id
            if restore or not keep:
                row.removed_at = None
                if row.document_id is not None:
                    _show(session, [row.document_id])
            session.add(row)
            session.commit()
        return before

    def _rename(self, old: str, new: str, seen: Seen) -> None:
        """Move an entry to its new path: the same document, its external id and name moved."""
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
                if TAKES_EXTERNAL_ID and getattr(doc, "external_id", None) == old:
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
            hide.update(d for d in serving if d is not None and TAKES_EXTERNAL_ID)
            session.flush()
            _hide(session, [d for d in hide if not _live_refs(session, d)], now)
            session.commit()

    def _drop_unused(self, document_id: int) -> None:
        with Session(self.ctx.engine) as session:
            if _live_refs(session, document_id):
                return
        delete_document(self.ctx, f"doc:{document_id}", actor=self.actor, reason="source changed")

    def finish(self, status: str, message: str, listing: Listing | None = None) -> SyncResult:
        plan = self.plan
        counts = plan.counts()
        counts["failed"] = len(self.failed)
        with Session(self.ctx.engine) as session:
            run = session.get(SourceRun, self.run_id)
            assert run is not None
            run.status, run.message = status, message
            run.finished_at = db_now(session)
            run.listed, run.unchanged = plan.listed, plan.unchanged + len(plan.touch)
            run.added, run.changed, run.renamed = len(plan.add), len(plan.change), len(plan.rename)
            run.removed, run.held, run.failed = len(plan.remove), len(plan.held), len(self.failed)
            run.counts = {**counts, "failures": self.failed[:50]}
            src = session.get(Source, self.src.id)
            if src is not None and src.every_seconds:
                src.next_run_at = run.finished_at + timedelta(seconds=src.every_seconds)
                session.add(src)
            session.add(run)
            records.record_synced(session, source=self.src, run=run, dataset=self.ds.name)
            session.commit()
            seconds = (run.finished_at - _aware(run.started_at)).total_seconds()
        if self.failed:
            message += f"; {len(self.failed)} file(s) could not be read or were refused"
        log.info("source %s synced (%s): %s", self.src.name, status, message)
        return SyncResult(
            self.src.name,
            True,
            status=status,
            run_id=self.run_id,
            counts=counts,
            failed=self.failed,
            held_reason=plan.held_reason,
            message=message,
            seconds=round(seconds, 3),
        )


def db_now_of(ctx: Context) -> datetime:
    with Session(ctx.engine) as session:
        return db_now(session)


def _aware(value: datetime) -> datetime:
    from sluice.storage.clock import as_utc

    return as_utc(value)


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
    from sluice.storage.models import Job, JobStatus

    job = session.get(Job, doc.active_job_id)
    return job is not None and job.status == JobStatus.succeeded


# -- tombstones -----------------------------------------------------------------------------------


def undo(ctx: Context, name: str, *, actor: str = "system") -> str:
    """Bring back what the source's syncs tombstoned (within the tombstone time): its documents
    serve again from the chunks they kept; nothing is embedded."""
    records.ensure_tables(ctx.engine)
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
    records.ensure_tables(ctx.engine)
    hours = ctx.settings.sync_tombstone_hours
    with Session(ctx.engine) as session:
        cutoff = db_now(session) - timedelta(hours=hours)
        rows = session.exec(
            select(SourceEntry).where(col(SourceEntry.removed_at).is_not(None))
        ).all()
        due = [r for r in rows if r.removed_at is not None and _aware(r.removed_at) <= cutoff]
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
        took.add_metric([v.name], (_aware(finish) - _aware(start)).total_seconds())
        ended.add_metric([v.name], _aware(finish).timestamp())
    return [docs, files, took, ended]
