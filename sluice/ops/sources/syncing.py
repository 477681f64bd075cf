"""Sources that stay in sync: a folder or an S3 prefix a dataset follows.

A sync lists the source, reads again only the files whose size or time moved, and compares their
sha256 with what it recorded (``sluice.storage.source_records``): new files are uploaded under
``<source>:<path>`` as external id (``ownership``), changed ones become a new version of their
document (the old one serves until the new one succeeds), a file gone whose bytes show up under a
new path is a rename (its entry and every version under its id move; nothing is embedded), and
files gone from a complete listing are tombstoned (``tombstones``): their documents leave search at
once and keep their bytes and chunks for ``SLUICE_SYNC_TOMBSTONE_HOURS`` (``undo`` brings them
back without embedding), then are removed for good. A listing that failed or came back empty, or
a sync that would remove more than ``SLUICE_SYNC_MAX_REMOVE_FRACTION`` of the source's documents,
removes nothing until confirmed. A new source uploads nothing until its first sync is confirmed.

The sync carries out the plan its preview shows (``plan.make_plan``, through
``previewing.plan_source``), each file's step as soon as it is planned. Every change of a source
(a sync, a remove, an undo, a purge) holds the source's lease, with a fencing token that each of
its writes checks in its own transaction, an upload checks it before it stores anything; a sync
killed halfway leaves what it wrote, and the next one goes on from there. A source removes only
the documents it made; each change writes its audit row.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlmodel import Session, col, select

from sluice import faults
from sluice.ops import audit_trail, ingest
from sluice.ops.access import Operator
from sluice.ops.documents import delete_document
from sluice.ops.sources import leases, ownership, tombstones
from sluice.ops.sources.leases import LEASE_SECONDS, SourceError, SourceExists, SourceLeaseLost
from sluice.ops.sources.leases import SourceBusy as SourceBusy  # the refusals, for the front ends
from sluice.ops.sources.leases import UnknownSource as UnknownSource
from sluice.ops.sources.listing import parse_s3
from sluice.ops.sources.plan import CHANGE, RENAME, RESTORE, TOUCH, Plan, Step, SyncResult
from sluice.ops.sources.previewing import plan_source, preview_sync
from sluice.ops.sources.tombstones import purge_expired as purge_expired  # for the front ends
from sluice.ops.sources.tombstones import undo as undo
from sluice.pipeline.running import chunk_copies
from sluice.pipeline.running.context import Context
from sluice.storage import source_records as records
from sluice.storage import webhook_records
from sluice.storage.clock import as_utc, db_now
from sluice.storage.db import ensure_dataset
from sluice.storage.models import Dataset, Document
from sluice.storage.source_records import Source, SourceEntry, SourceRun

log = logging.getLogger(__name__)

NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")
NAME_RULE = "A source name is 1 to 64 lower-case letters, digits, '.', '_' or '-'."
EVERY = re.compile(r"^(\d+)\s*([smhd])$")
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


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
    # "unconfirmed": added, nothing uploaded until its first sync is confirmed; else "confirmed"
    state: str = "confirmed"
    confirmed: bool = True
    preview: dict[str, Any] | None = None  # what the first sync would do (the answer to an add)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class RemovedSource:
    """What a remove did: the documents the source made (deleted, unless kept) and those it
    adopted (in the dataset before it: released, never deleted)."""

    message: str
    deleted: int = 0
    kept: int = 0
    adopted: int = 0


def _refusal_row(ctx: Context, who: Operator, action: str, name: str, **kw: Any) -> None:
    """A refused change's audit row, in a transaction of its own."""
    with Session(ctx.engine) as session:
        session.info[audit_trail.OWN] = True
        audit_trail.add_row(
            session, who, action, target_kind="source", target_id=name, outcome="refused", **kw
        )
        session.commit()


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


def _where(
    ctx: Context, *, name: str, dataset: str, folder: str | None, s3: str | None
) -> tuple[str, str]:
    """A new source's names checked, and what it follows: (``folder`` or ``s3``, its location)."""
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
    return kind, location


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
    who: Operator | None = None,
    preview: bool = False,
) -> SourceView:
    """A new source of ``dataset`` (made if need be): ``folder`` or ``s3``, synced every ``every``
    (``15m``) by the workers, or only when asked. Nothing is uploaded until its first sync is
    confirmed (``sync(confirm=True)``); the schedule and the folder watch start after it.
    ``preview``: the answer carries what that first sync would do (``SourceView.preview``)."""
    actor = who.actor if who is not None else actor
    who = leases.acting(who, actor)
    kind, location = _where(ctx, name=name, dataset=dataset, folder=folder, s3=s3)
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
                next_run_at=None,  # the schedule starts with the confirmed first sync
                unconfirmed_since=db_now(session),
            )
        )
        audit_trail.add_row(
            session,
            who,
            "source.add",
            target_kind="source",
            target_id=name,
            dataset=ds.name,
            params={"kind": kind, "location": location, "every_seconds": seconds},
        )
        session.commit()
    log.info("source %s (%s %s -> %s) added by %s", name, kind, location, dataset, actor)
    view = get_source(ctx, name)
    if preview:
        with Session(ctx.engine, expire_on_commit=False) as session:
            src = _source(session, name)
            ds_row = session.get(Dataset, src.dataset_id)
        assert ds_row is not None
        view.preview = preview_sync(ctx, src, ds_row).to_dict()
    return view


def _source(session: Session, name: str) -> Source:
    return leases.source_named(session, name)


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
        state="unconfirmed" if src.unconfirmed_since is not None else "confirmed",
        confirmed=src.unconfirmed_since is None,
    )


def get_source(ctx: Context, name: str) -> SourceView:
    with Session(ctx.engine) as session:
        return _view(session, _source(session, name))


def list_sources(ctx: Context) -> list[SourceView]:
    with Session(ctx.engine) as session:
        return [_view(session, s) for s in records.all_sources(session)]


def remove_source(
    ctx: Context,
    name: str,
    *,
    keep_documents: bool = False,
    actor: str = "system",
    who: Operator | None = None,
) -> RemovedSource:
    """Forget a source, under its lease (SourceBusy while a sync of it runs); the documents it
    made are deleted too unless ``keep_documents``, those it adopted (in the dataset before it)
    are released, never deleted. Every version serving under its files' ids counts."""
    actor = who.actor if who is not None else actor
    who = leases.acting(who, actor)
    with Session(ctx.engine, expire_on_commit=False) as session:
        src = _source(session, name)
        ds = session.get(Dataset, src.dataset_id)
    token = leases.take(ctx, src, holder=f"a remove by {who.actor}"[:120])
    try:
        with Session(ctx.engine) as session:
            leases.fence(session, src.id, token)
            made: set[int] = set()
            adopted: set[int] = set()
            for row in records.entries(session, src.id):
                for doc in ownership.serving_versions(session, src.dataset_id, row):
                    mine = ownership.owns(session, row, doc.id, name)
                    (made if mine else adopted).add(doc.id)
            adopted -= made
            for row in records.entries(session, src.id):
                session.delete(row)
            for run in session.exec(select(SourceRun).where(SourceRun.source_id == src.id)).all():
                session.delete(run)
            session.flush()
            tombstones.show(session, sorted(adopted))  # released as they were before the source
            audit_trail.add_row(
                session,
                who,
                "source.remove",
                target_kind="source",
                target_id=name,
                dataset=ds.name if ds else None,
                params={
                    "deleted": 0 if keep_documents else len(made),
                    "kept": len(made) if keep_documents else 0,
                    "adopted": len(adopted),
                    "keep_documents": keep_documents,
                },
            )
            lease = records.lease_of(session, src.id)
            if lease is not None:
                session.delete(lease)
            session.delete(session.get(Source, src.id))
            session.commit()
    except BaseException:
        leases.release(ctx, src.id, token)
        raise
    deleted = 0
    if not keep_documents:
        for doc_id in sorted(made):
            done = delete_document(ctx, f"doc:{doc_id}", actor=actor, reason="source removed")
            deleted += done.ok
    text = f"{len(made)} document(s) " + ("kept" if keep_documents else f"deleted: {deleted}")
    if adopted:
        text += (
            f"; {len(adopted)} kept: they were in the dataset before the source found the same "
            "bytes (released, not deleted)"
        )
    log.info("source %s removed by %s (%s)", name, actor, text)
    return RemovedSource(
        f"source {name} removed; {text}",
        deleted=deleted,
        kept=len(made) if keep_documents else 0,
        adopted=len(adopted),
    )


# -- a sync ---------------------------------------------------------------------------------------


def sync(
    ctx: Context,
    name: str,
    *,
    actor: str = "system",
    preview: bool = False,
    confirm: bool = False,
    publish: Callable[[int], None] | None = None,
    who: Operator | None = None,
) -> SyncResult:
    """Sync one source now (or only show what a sync would do: ``preview``). A source's first
    sync uploads only when confirmed: unconfirmed, the answer is its preview (``unconfirmed``)."""
    actor = who.actor if who is not None else actor
    who = leases.acting(who, actor)
    with Session(ctx.engine, expire_on_commit=False) as session:
        src = _source(session, name)
        ds = session.get(Dataset, src.dataset_id)
    assert ds is not None
    if preview:
        return preview_sync(ctx, src, ds, confirm=confirm)
    if src.unconfirmed_since is not None and not confirm:
        return _unconfirmed(ctx, src, ds, who)
    with Session(ctx.engine) as session:
        token = records.take_lease(
            session, source_id=src.id, holder=leases.sync_holder(), seconds=LEASE_SECONDS
        )
        if token is None:
            holder = records.holder_of(session, src.id)
            _refusal_row(
                ctx,
                who,
                "source.sync",
                name,
                dataset=ds.name,
                code="sync_running",
                reason=f"busy: {holder}",
            )
            return SyncResult(name, False, status="busy", message=f"{name} is busy: {holder}")
        records.mark_interrupted(session, src.id)
        run = SourceRun(source_id=src.id, actor=actor, started_at=db_now(session))
        session.add(run)
        row = session.get(Source, src.id, populate_existing=True)
        if row is not None and row.unconfirmed_since is not None:  # confirmed: from now on
            row.unconfirmed_since = None  # the schedule and the watch follow it
            session.add(row)
        session.commit()
        run_id = run.id
    job = _Sync(ctx, src, ds, token, run_id, confirm=confirm, publish=publish, who=who)
    try:
        return job.run()
    except SourceLeaseLost:
        return job.finish("interrupted", "the lease was taken by another change; this one stopped")
    finally:
        leases.release(ctx, src.id, token)


def _unconfirmed(ctx: Context, src: Source, ds: Dataset, who: Operator) -> SyncResult:
    """The answer to a sync of a source whose first sync is not confirmed: its plan, nothing
    done."""
    shown = preview_sync(ctx, src, ds)
    shown.status = "unconfirmed"
    shown.message = (
        f"nothing uploaded: the first sync of {src.name} waits for confirmation (sluice sync "
        f'{src.name} --yes; the API: "confirm": true). It would do: {shown.message}'
    )
    _refusal_row(
        ctx, who, "source.sync", src.name, dataset=ds.name, code="unconfirmed", reason=shown.message
    )
    return shown


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
        who: Operator,
    ) -> None:
        self.ctx, self.src, self.ds, self.token, self.run_id = ctx, src, ds, token, run_id
        self.confirm, self.publish, self.who = confirm, publish, who
        self.plan = Plan()  # filled as the sync goes: one stopped halfway reports what it did
        self.uploaded: list[int] = []  # documents its uploads made or named (the audit row)

    def run(self) -> SyncResult:
        plan = plan_source(
            self.ctx, self.src, confirm=self.confirm, carry_out=self._carry_out, into=self.plan
        )
        self._tombstone(plan.remove)
        tombstones.purge_expired(self.ctx, held=(self.src.id, self.token))
        status = "failed" if plan.error is not None else "held" if plan.held else "done"
        return self.finish(status, plan.describe())

    def _carry_out(self, step: Step, data: bytes) -> str | None:
        """One step of the plan, under the lease; why it was refused, if it was."""
        refused = None
        if step.action == TOUCH:
            self._write(step, keep=True)
        elif step.action == RESTORE:
            if not self._write(step, keep=True, restore=True):  # purged first: a new file now
                refused = self._ingest(step, data)
        elif step.action == RENAME:
            self._rename(step)
        else:
            refused = self._ingest(step, data)
        faults.hit("source_applied", source=self.src.name, path=step.path)
        return refused

    def _fence(self, session: Session) -> None:
        leases.fence(session, self.src.id, self.token)

    def _ingest(self, step: Step, data: bytes) -> str | None:
        """Upload an added or changed file under the source's external id of its path (a change
        becomes a new version of its document, under the id its entry names); why ingest refused
        it, if it did. The lease is checked before anything is stored: a sync that lost it
        uploads nothing more. The same bytes already a document of the dataset under another id
        are adopted, not uploaded."""
        with Session(self.ctx.engine) as session:
            self._fence(session)
            known = _entry(session, self.src.id, step.path)
            ext = ownership.external_id(self.src.name, step.path)
            previous = None  # the document of the file's old bytes, when the source made it
            if known is not None and step.action == CHANGE:
                ext = ownership.entry_external_id(known)
                if known.document_id is not None and ownership.owns(
                    session, known, known.document_id, self.src.name
                ):
                    previous = known.document_id
            session.commit()
        got = ingest.ingest_bytes(
            self.ctx,
            data,
            dataset_id=self.ds.id,
            filename=step.path.rsplit("/", 1)[-1],
            actor=f"source:{self.src.name}",
            publish=self.publish,
            external_id=ext,
        )
        faults.hit("source_uploaded", source=self.src.name, path=step.path)
        if got.accepted and got.document_id is not None:
            document_id, job_id = got.document_id, got.job_id
            with Session(self.ctx.engine) as session:
                owned = ownership.made_by(session, document_id, self.src.name)
        else:
            same = self._same_bytes(step) if got.error_code == "external_id_conflict" else None
            if same is None:
                return f"{got.error_code}: {got.message}"
            (document_id, job_id) = same
            with Session(self.ctx.engine) as session:  # another file of this source made it
                owned = ownership.made_by(session, document_id, self.src.name)
        try:
            self._write(step, document_id=document_id, job_id=job_id, owned=owned, external_id=ext)
        except SourceLeaseLost:
            if owned and got.accepted and not got.duplicate:
                self._drop_if_orphaned(document_id)
            raise
        self.uploaded.append(document_id)
        if previous is not None and previous != document_id and not self._replaces(previous, got):
            self._drop_replaced(previous)
        return None

    def _replaces(self, previous: int, got: ingest.IngestResult) -> bool:
        """Whether the upload's document takes over from ``previous`` at its success: a new
        version of the id ``previous`` carries (not one of bytes another file made first)."""
        if not got.accepted:
            return False
        with Session(self.ctx.engine) as session:
            old = session.get(Document, previous)
            new = session.get(Document, got.document_id)
            return old is not None and new is not None and old.external_id == new.external_id

    def _drop_replaced(self, document_id: int) -> None:
        """The document of a changed file's old bytes, when the file now holds bytes another
        document has (the entry adopted that one), or the old bytes were another file's document
        under that file's id: nothing would replace it, so it goes, unless an entry names it."""
        with Session(self.ctx.engine) as session:
            if records.named_documents(session, [document_id]):
                return
        delete_document(
            self.ctx,
            f"doc:{document_id}",
            actor=self.who.actor,
            reason="its file now holds the bytes of another document",
        )

    def _same_bytes(self, step: Step) -> tuple[int, int | None] | None:
        """The live document of the dataset with these bytes (under an id of its own): the entry
        names it as adopted."""
        with Session(self.ctx.engine) as session:
            doc = session.exec(
                select(Document).where(
                    Document.dataset_id == self.ds.id,
                    Document.sha256 == step.sha256,
                    col(Document.deleted_at).is_(None),
                )
            ).first()
            return (doc.id, doc.active_job_id) if doc is not None else None

    def _drop_if_orphaned(self, document_id: int) -> None:
        """A document this sync's upload made after another change took the lease: deleted when
        its source is gone (a remove took the lease), so nothing is left that no one owns."""
        with Session(self.ctx.engine) as session:
            if session.get(Source, self.src.id) is not None:
                return  # the next sync of the source finds it (its bytes, its id) and names it
        delete_document(
            self.ctx, f"doc:{document_id}", actor=self.who.actor, reason="source removed"
        )

    def _write(
        self,
        step: Step,
        *,
        keep: bool = False,
        restore: bool = False,
        document_id: int | None = None,
        job_id: int | None = None,
        owned: bool | None = None,
        external_id: str | None = None,
    ) -> bool:
        """Record one file as read (under the lease); ``keep`` its document, or name the new one.
        False: a ``restore`` found its tombstone purged first (the caller uploads the file)."""
        seen = step.seen
        left: list[int] = []  # a tombstone's document that no entry will name
        with Session(self.ctx.engine) as session:
            self._fence(session)
            row = _entry(session, self.src.id, step.path)
            if restore:
                if row is None or not tombstones.restore_one(session, row):
                    session.rollback()
                    return False
                row.removed_at = None
            if row is None:
                row = SourceEntry(
                    source_id=self.src.id, path=step.path, size=0, mtime_ns=0, sha256=step.sha256
                )
            row.size, row.mtime_ns, row.etag = seen.size, seen.mtime_ns, seen.etag
            row.sha256 = step.sha256
            row.updated_at = db_now(session)
            if not keep:
                old = row.document_id
                if row.removed_at is not None and old is not None and old != document_id:
                    if ownership.owns(session, row, old, self.src.name):
                        left.append(old)
                row.document_id, row.job_id = document_id, job_id
                row.owned, row.external_id = owned, external_id
                row.removed_at = None
                if row.document_id is not None:
                    tombstones.show(session, [row.document_id])
            session.add(row)
            session.commit()
        self._drop_unnamed(left)
        return True

    def _drop_unnamed(self, document_ids: list[int]) -> None:
        """Documents of tombstones that no entry names any more (a file added or renamed onto a
        tombstone's path): deleted as the purge would, under the lease."""
        if not document_ids:
            return
        with Session(self.ctx.engine) as session:
            named = records.named_documents(session, document_ids)
            gone = [
                d
                for d in document_ids
                if d not in named
                and (doc := session.get(Document, d)) is not None
                and doc.deleted_at is not None
            ]
        for doc_id in gone:
            delete_document(
                self.ctx, f"doc:{doc_id}", actor="source tombstone", reason="tombstone replaced"
            )

    def _rename(self, step: Step) -> None:
        """Move an entry to its new path: its document and every version serving under its
        external id (the one still serving while a new version is built, the new one) take the
        new path's id and name; nothing is embedded."""
        old, new, seen = step.old, step.path, step.seen
        dropped: list[int] = []  # the document of a tombstone under the new path
        with Session(self.ctx.engine) as session:
            self._fence(session)
            stale = _entry(session, self.src.id, new)  # a tombstone under the new path
            if stale is not None:
                if stale.document_id is not None and ownership.owns(
                    session, stale, stale.document_id, self.src.name
                ):
                    dropped.append(stale.document_id)
                session.delete(stale)
                session.flush()
            row = _entry(session, self.src.id, old)
            assert row is not None
            old_id = ownership.entry_external_id(row)
            new_id = ownership.external_id(self.src.name, new)
            moved = ownership.serving_versions(session, self.ds.id, row)
            row.path, row.size, row.mtime_ns, row.etag = new, seen.size, seen.mtime_ns, seen.etag
            row.external_id = new_id
            row.updated_at = db_now(session)
            session.add(row)
            others = []
            for doc in moved:
                if doc.external_id != old_id and doc.id != row.document_id:
                    continue
                doc.filename = ingest.sanitize_filename(new)
                if doc.external_id == old_id:
                    doc.external_id = new_id
                session.add(doc)
                if doc.id != row.document_id:
                    others.append(doc.id)
            session.commit()
            chunk_copies.follow_document(self.ctx, row.document_id)  # the name on its chunks too
        for doc_id in others:  # the other versions' chunks follow their rows as well
            chunk_copies.follow_document(self.ctx, doc_id)
        self._drop_unnamed(dropped)

    def _tombstone(self, paths: list[str]) -> None:
        """The removed files' entries become tombstones; what they serve leaves search."""
        if not paths:
            return
        with Session(self.ctx.engine) as session:
            self._fence(session)
            rows = [r for r in (_entry(session, self.src.id, p) for p in paths) if r is not None]
            tombstones.tombstone(
                session,
                source_name=self.src.name,
                dataset_id=self.ds.id,
                rows=rows,
                now=db_now(session),
            )
            session.commit()

    def finish(self, status: str, message: str) -> SyncResult:
        """Record the run's end (its counts, the next run's time, the webhook event)."""
        plan = self.plan
        counts = plan.counts()
        with Session(self.ctx.engine) as session:
            run = session.get(SourceRun, self.run_id)
            if run is None:  # a remove of the source took the lease and its runs
                log.info("source %s was removed during its sync", self.src.name)
                return SyncResult(
                    self.src.name,
                    True,
                    status="interrupted",
                    run_id=self.run_id,
                    counts=counts,
                    failed=plan.failed,
                    message="the source was removed during this sync; it stopped",
                )
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
            audit_trail.add_row(
                session,
                self.who,
                "source.sync",
                target_kind="source",
                target_id=self.src.name,
                dataset=self.ds.name,
                params={
                    **counts,
                    "run_id": self.run_id,
                    "status": status,
                    "documents": self.uploaded[:50],
                },
                reason=message,
            )
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
