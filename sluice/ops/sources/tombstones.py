"""A source's tombstones: a file gone from the source leaves search at once, its document's jobs,
chunks and bytes kept for ``SLUICE_SYNC_TOMBSTONE_HOURS`` (``sluice sources undo`` serves it again
without embedding), then the purge removes it for good.

Each function here works in its caller's transaction, which the caller fences on the source's
lease (``sluice.ops.sources.syncing``); a tombstone's restore and its purge are each one
conditional statement on the entry's row (``source_records.restore_entry`` and ``purge_entry``), so
when both reach one entry the database lets exactly one of them have it. Only the documents the
source made are hidden or deleted (``ownership``); one it adopted stays as it was.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlmodel import Session, col, select

from sluice import faults
from sluice.ops import audit_trail
from sluice.ops.access import Operator
from sluice.ops.documents import delete_document
from sluice.ops.sources import leases, ownership
from sluice.pipeline.running.context import Context
from sluice.storage import source_records as records
from sluice.storage.clock import db_now
from sluice.storage.models import Dataset, Document, Job, JobStatus
from sluice.storage.source_records import Source, SourceEntry

log = logging.getLogger(__name__)


def entry_at(session: Session, source_id: int, path: str) -> SourceEntry | None:
    return session.exec(
        select(SourceEntry)
        .where(SourceEntry.source_id == source_id, SourceEntry.path == path)
        .execution_options(populate_existing=True)
    ).first()


def live_refs(session: Session, document_id: int) -> int:
    """Entries of any source that still name this document as a live file."""
    return len(
        session.exec(
            select(SourceEntry.id).where(
                SourceEntry.document_id == document_id, col(SourceEntry.removed_at).is_(None)
            )
        ).all()
    )


def hide(session: Session, document_ids: list[int], now: datetime) -> None:
    """Tombstoned documents leave search at once (search serves live documents only); their
    jobs, chunks and bytes stay."""
    for doc_id in document_ids:
        doc = session.get(Document, doc_id)
        if doc is not None and doc.deleted_at is None:
            doc.deleted_at = now
            session.add(doc)


def show(session: Session, document_ids: list[int]) -> None:
    """Tombstoned documents back in search, those whose searchable job is still there (one whose
    first job has not succeeded yet comes back with that success: ``storage.jobs.success``)."""
    for doc_id in document_ids:
        doc = session.get(Document, doc_id, populate_existing=True)
        if doc is not None and doc.deleted_at is not None and doc.active_job_id is not None:
            job = session.get(Job, doc.active_job_id)
            if job is not None and job.status == JobStatus.succeeded:
                doc.deleted_at = None
                session.add(doc)


def tombstone(
    session: Session, *, source_name: str, dataset_id: int, rows: list[SourceEntry], now: datetime
) -> int:
    """Mark ``rows`` removed and hide what they serve that the source made: the entry's document
    and every version serving under its external id (a replacement that failed leaves the old
    one serving while the entry names the new one). The number of documents hidden."""
    hide_ids: set[int] = set()
    for row in rows:
        row.removed_at = now
        session.add(row)
        for doc in ownership.serving_versions(session, dataset_id, row):
            if ownership.owns(session, row, doc.id, source_name):
                hide_ids.add(doc.id)
    session.flush()
    hidden = [d for d in sorted(hide_ids) if not live_refs(session, d)]
    hide(session, hidden, now)
    return len(hidden)


def restore_all(session: Session, source_id: int) -> int:
    """Every tombstone of the source back (each by compare-and-set on its row), its documents
    in search again. How many came back."""
    rows = [r for r in records.entries(session, source_id) if r.removed_at is not None]
    back = [r for r in rows if records.restore_entry(session, r.id)]
    session.flush()
    show(session, sorted({r.document_id for r in back if r.document_id is not None}))
    return len(back)


def restore_one(session: Session, entry: SourceEntry) -> bool:
    """One tombstone back (a sync found its file again with the same bytes): False when the
    purge removed the entry first (the caller uploads the file as new)."""
    if not records.restore_entry(session, entry.id):
        again = session.get(SourceEntry, entry.id, populate_existing=True)
        if again is None:
            return False
    if entry.document_id is not None:
        show(session, [entry.document_id])
    return True


@dataclass
class Purged:
    entries: int = 0
    delete: list[int] = field(default_factory=list)  # documents the source made: deleted after
    released: list[int] = field(default_factory=list)  # documents it adopted: left as they are


def purge(session: Session, *, source_name: str, source_id: int, cutoff: datetime) -> Purged:
    """Delete the source's tombstones older than ``cutoff`` (each by compare-and-set: one a
    restore or an undo took back first stays) and say which documents go with them: those the
    source made that no entry names any more (the caller deletes them after the commit, under
    the same lease); those it adopted are released (shown again if an older sync hid them)."""
    rows = session.exec(
        select(SourceEntry).where(
            SourceEntry.source_id == source_id,
            col(SourceEntry.removed_at).is_not(None),
            col(SourceEntry.removed_at) <= cutoff,
        )
    ).all()
    out = Purged()
    owned: dict[int, bool] = {}
    for row in rows:
        doc_id = row.document_id
        if doc_id is not None:
            owned[doc_id] = owned.get(doc_id, False) or ownership.owns(
                session, row, doc_id, source_name
            )
        if records.purge_entry(session, row.id, cutoff):
            out.entries += 1
        elif doc_id is not None:
            owned.pop(doc_id, None)  # taken back meanwhile: its document stays
    session.flush()
    named = records.named_documents(session, list(owned))
    for doc_id, mine in sorted(owned.items()):
        if doc_id in named:
            continue
        (out.delete if mine else out.released).append(doc_id)
    show(session, out.released)
    return out


# -- undo and the purge, under the source's lease -----------------------------------------------


def undo(ctx: Context, name: str, *, actor: str = "system", who: Operator | None = None) -> str:
    """Bring back what the source's syncs tombstoned (within the tombstone time), under the
    source's lease (SourceBusy while a sync of it runs): its documents serve again from the
    chunks they kept; nothing is embedded."""
    actor = who.actor if who is not None else actor
    who = leases.acting(who, actor)
    with Session(ctx.engine, expire_on_commit=False) as session:
        src = leases.source_named(session, name)
        ds = session.get(Dataset, src.dataset_id)
    token = leases.take(ctx, src, holder=f"an undo by {who.actor}"[:120])
    try:
        with Session(ctx.engine) as session:
            leases.fence(session, src.id, token)
            back = restore_all(session, src.id)
            audit_trail.add_row(
                session,
                who,
                "source.undo",
                target_kind="source",
                target_id=name,
                dataset=ds.name if ds else None,
                params={"restored": back},
            )
            session.commit()
    except leases.SourceLeaseLost:
        raise leases.SourceBusy(f"source {name!r} is busy: another change took its lease") from None
    finally:
        leases.release(ctx, src.id, token)
    log.info("source %s: %d tombstoned file(s) brought back by %s", name, back, actor)
    return f"{back} tombstoned document(s) of {name} are back in search (nothing embedded)"


PURGER = Operator("source tombstone", "operator", channel="system")


def purge_expired(ctx: Context, *, held: tuple[int, int] | None = None) -> int:
    """Remove for good what was tombstoned longer than SLUICE_SYNC_TOMBSTONE_HOURS ago, each
    source under its lease (a source busy with a sync waits for the next round); ``held``: the
    (source id, fencing token) of the sync that calls this. The number of tombstones removed."""
    hours = ctx.settings.sync_tombstone_hours
    with Session(ctx.engine) as session:
        cutoff = db_now(session) - timedelta(hours=hours)
        due = sorted(
            set(
                session.exec(
                    select(SourceEntry.source_id).where(
                        col(SourceEntry.removed_at).is_not(None),
                        col(SourceEntry.removed_at) <= cutoff,
                    )
                ).all()
            )
        )
    faults.hit("source_purge_selected", source_ids=due)
    total = 0
    for source_id in due:
        with Session(ctx.engine, expire_on_commit=False) as session:
            src = session.get(Source, source_id)
            ds = session.get(Dataset, src.dataset_id) if src is not None else None
        if src is None:
            continue
        mine = held is not None and held[0] == source_id
        try:
            token = held[1] if held is not None and mine else leases.take(ctx, src, holder="purge")
        except leases.SourceBusy:
            continue  # a change of it runs: the next round purges
        try:
            total += _purge_source(ctx, src, ds, token, cutoff)
        except leases.SourceLeaseLost:
            continue
        finally:
            if not mine:
                leases.release(ctx, source_id, token)
    return total


def _purge_source(
    ctx: Context, src: Source, ds: Dataset | None, token: int, cutoff: datetime
) -> int:
    """One source's expired tombstones, fenced on its lease; the documents it made that no entry
    names any more are deleted after (still under the lease)."""
    with Session(ctx.engine) as session:
        leases.fence(session, src.id, token)
        purged = purge(session, source_name=src.name, source_id=src.id, cutoff=cutoff)
        if purged.entries:
            audit_trail.add_row(
                session,
                PURGER,
                "source.purge",
                target_kind="source",
                target_id=src.name,
                dataset=ds.name if ds else None,
                params={
                    "tombstones": purged.entries,
                    "deleted": len(purged.delete),
                    "released": len(purged.released),
                },
            )
        session.commit()
    for doc_id in purged.delete:
        delete_document(ctx, f"doc:{doc_id}", actor="source tombstone", reason="tombstone expired")
    return purged.entries
