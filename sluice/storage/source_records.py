"""Sources in the job database: what each one is, what a sync saw of it, its runs, and its lease.

- ``Source``: a folder or an S3 prefix that a dataset follows (``sluice.ops.sources``).
  ``unconfirmed_since``: added, its plan shown, and nothing uploaded until an operator confirms
  its first sync (the schedule and the folder watch start after it).
- ``SourceEntry``: one file of a source as the last sync saw it: its source-relative path, size,
  modification time and sha256, the document it became and the external id its versions carry
  (``<source>:<path>``; an entry written before that rule names none: its path is its id).
  ``owned`` says whether the source made that document or found it in the dataset already (then
  the source never hides nor deletes it). ``removed_at`` marks a tombstone: the file left the
  source, its document left search, its bytes and chunks stay until
  ``SLUICE_SYNC_TOMBSTONE_HOURS`` have passed.
- ``SourceRun``: one recorded sync, with its counts.
- ``SourceLease``: one change of a source at a time across the fleet (a sync, a remove, an undo,
  a purge): an expiring lease whose token grows with every holder (a fencing token: a write of an
  older holder is refused). A tombstone's restore and its purge are each one conditional statement
  on the entry's row (``restore_entry``, ``purge_entry``), so the database orders them.

The tables are made with every other (``sluice.storage.models`` imports them, ``db.init_schema``
creates and upgrades them); a sync's ``source.synced`` webhook is ``webhook_records.record_synced``.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Column,
    Text,
    UniqueConstraint,
    delete,
    exists,
    or_,
    update,
)
from sqlalchemy.exc import IntegrityError
from sqlmodel import Field, Session, SQLModel, col, select

from sluice.storage.clock import db_now


def _now() -> datetime:
    return datetime.now(UTC)


class Source(SQLModel, table=True):
    id: int = Field(default=None, primary_key=True)
    name: str = Field(max_length=64, unique=True)
    dataset_id: int = Field(foreign_key="dataset.id", index=True)
    kind: str = Field(max_length=10)  # folder | s3
    location: str = Field(max_length=1000)
    include: list[str] = Field(default_factory=list, sa_column=Column(JSON))
    exclude: list[str] = Field(default_factory=list, sa_column=Column(JSON))
    every_seconds: int | None = None  # None: synced only when asked
    created_at: datetime = Field(default_factory=_now)
    created_by: str = Field(default="", max_length=120)
    next_run_at: datetime | None = None
    # Set when added: its first sync waits for an operator's confirmation (None: confirmed, and
    # every source made before this rule).
    unconfirmed_since: datetime | None = None


class SourceEntry(SQLModel, table=True):
    __tablename__ = "source_entry"
    __table_args__ = (UniqueConstraint("source_id", "path", name="uq_source_entry_path"),)

    id: int = Field(default=None, primary_key=True)
    source_id: int = Field(foreign_key="source.id", index=True)
    path: str = Field(max_length=1000)
    size: int = Field(sa_column=Column(BigInteger, nullable=False))
    mtime_ns: int = Field(sa_column=Column(BigInteger, nullable=False))
    etag: str | None = Field(default=None, max_length=200)  # an object store's ETag (S3 sources)
    sha256: str = Field(max_length=64, index=True)
    document_id: int | None = Field(default=None, index=True)
    job_id: int | None = None
    removed_at: datetime | None = None
    updated_at: datetime = Field(default_factory=_now)
    # The external id of the entry's documents (None: an entry of before, whose id is its path).
    external_id: str | None = Field(default=None, max_length=512)
    # True: the source made the document; False: it was in the dataset before the source named it
    # (released on removal, never deleted); None: an entry of before (judged by the document's
    # first job: ``sluice.ops.sources.ownership``).
    owned: bool | None = None


class SourceRun(SQLModel, table=True):
    __tablename__ = "source_run"

    id: int = Field(default=None, primary_key=True)
    source_id: int = Field(foreign_key="source.id", index=True)
    actor: str = Field(default="system", max_length=120)
    status: str = Field(default="running", max_length=20)  # running done held failed interrupted
    started_at: datetime = Field(default_factory=_now)
    finished_at: datetime | None = None
    listed: int = 0
    added: int = 0
    changed: int = 0
    renamed: int = 0
    removed: int = 0
    failed: int = 0
    unchanged: int = 0
    held: int = 0  # removals the guard held back
    message: str = Field(default="", sa_column=Column(Text))
    counts: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON))


class SourceLease(SQLModel, table=True):
    __tablename__ = "source_lease"

    source_id: int = Field(primary_key=True)
    holder: str = Field(max_length=120)
    token: int = 1
    expires_at: datetime


# -- the lease ------------------------------------------------------------------------------------


def take_lease(session: Session, *, source_id: int, holder: str, seconds: float) -> int | None:
    """The lease of one source for ``seconds`` by the job database's clock: its fencing token, or
    None while another holder's lease runs."""
    now = db_now(session)
    until = now + timedelta(seconds=seconds)
    if session.get(SourceLease, source_id) is None:
        try:
            session.add(SourceLease(source_id=source_id, holder=holder, token=1, expires_at=until))
            session.commit()
            return 1
        except IntegrityError:
            session.rollback()
    taken = session.execute(
        update(SourceLease)
        .where(col(SourceLease.source_id) == source_id, col(SourceLease.expires_at) < now)
        .values(holder=holder, token=SourceLease.token + 1, expires_at=until)
    )
    session.commit()
    if getattr(taken, "rowcount", 0) != 1:
        return None
    lease = session.get(SourceLease, source_id, populate_existing=True)
    return lease.token if lease is not None else None


def renew_lease(session: Session, *, source_id: int, token: int, seconds: float) -> bool:
    """In the caller's transaction: extend the lease if ``token`` still holds it (the fence every
    write of a sync goes through). False: another holder took it; write nothing."""
    until = db_now(session) + timedelta(seconds=seconds)
    done = session.execute(
        update(SourceLease)
        .where(col(SourceLease.source_id) == source_id, col(SourceLease.token) == token)
        .values(expires_at=until)
    )
    return getattr(done, "rowcount", 0) == 1


def release_lease(session: Session, *, source_id: int, token: int) -> None:
    session.execute(
        update(SourceLease)
        .where(col(SourceLease.source_id) == source_id, col(SourceLease.token) == token)
        .values(expires_at=db_now(session) - timedelta(seconds=1))
    )
    session.commit()


def lease_of(session: Session, source_id: int) -> SourceLease | None:
    return session.get(SourceLease, source_id, populate_existing=True)


def holder_of(session: Session, source_id: int) -> str:
    """Who holds the source's lease now, in words (for a refusal)."""
    lease = lease_of(session, source_id)
    return lease.holder if lease is not None else "another process"


# -- tombstones, by compare-and-set ---------------------------------------------------------------


def restore_entry(session: Session, entry_id: int) -> bool:
    """In the caller's transaction: a tombstone back to a live entry, if it is still one. False:
    it is gone (purged) or live already; the caller reads the row again to know which."""
    done = session.execute(
        update(SourceEntry)
        .where(col(SourceEntry.id) == entry_id, col(SourceEntry.removed_at).is_not(None))
        .values(removed_at=None)
        .execution_options(synchronize_session=False)
    )
    return getattr(done, "rowcount", 0) == 1


def purge_entry(session: Session, entry_id: int, cutoff: datetime) -> bool:
    """In the caller's transaction: delete a tombstone older than ``cutoff``, if it still is one
    (a restore or an undo that landed first wins). True: this purge removed it."""
    done = session.execute(
        delete(SourceEntry)
        .where(
            col(SourceEntry.id) == entry_id,
            col(SourceEntry.removed_at).is_not(None),
            col(SourceEntry.removed_at) <= cutoff,
        )
        .execution_options(synchronize_session=False)
    )
    return getattr(done, "rowcount", 0) == 1


def named_documents(session: Session, document_ids: list[int]) -> set[int]:
    """Which of these documents an entry of any source still names (live or tombstoned)."""
    if not document_ids:
        return set()
    found = session.exec(
        select(SourceEntry.document_id).where(col(SourceEntry.document_id).in_(document_ids))
    ).all()
    return {d for d in found if d is not None}


# -- reads ----------------------------------------------------------------------------------------


def by_name(session: Session, name: str) -> Source | None:
    return session.exec(select(Source).where(Source.name == name)).first()


def all_sources(session: Session) -> list[Source]:
    return list(session.exec(select(Source).order_by(col(Source.name))).all())


def entries(session: Session, source_id: int) -> list[SourceEntry]:
    return list(session.exec(select(SourceEntry).where(SourceEntry.source_id == source_id)).all())


def tombstoned_documents(session: Session, dataset_id: int) -> set[int]:
    """The dataset's documents a sync tombstoned: out of search, their chunks and bytes kept
    until ``SLUICE_SYNC_TOMBSTONE_HOURS`` pass so that ``sources undo`` serves them again
    (reconcile keeps their chunks). A document an entry still names as a live file is not one."""
    rows = session.exec(
        select(SourceEntry.document_id, SourceEntry.removed_at)
        .join(Source, col(Source.id) == col(SourceEntry.source_id))
        .where(Source.dataset_id == dataset_id, col(SourceEntry.document_id).is_not(None))
    ).all()
    removed = {doc for doc, at in rows if at is not None and doc is not None}
    return removed - {doc for doc, at in rows if at is None}


def can_come_back(document_id: Any) -> Any:
    """A clause on a document id column: a source's entry (a tombstone, or a live file) names the
    document, in a dataset not being deleted: ``sources undo`` (or the next sync) may serve it
    again, so its bytes must stay (the blob users count it)."""
    dataset = SQLModel.metadata.tables["dataset"]
    return exists(
        select(SourceEntry.id)
        .join(Source, col(Source.id) == col(SourceEntry.source_id))
        .join(dataset, dataset.c.id == col(Source.dataset_id))
        .where(col(SourceEntry.document_id) == document_id, dataset.c.deleting_at.is_(None))
    )


def is_tombstoned(session: Session, document_id: int, *, lock: bool = False) -> bool:
    """A sync tombstoned this document (the entries that name it or another version of its
    external id are removed, none live: a tombstone hides every version serving under the id):
    its removal must win over a job of it that succeeds late (``storage.jobs``). ``lock``: hold
    the entries' rows to the caller's commit (PostgreSQL), so an undo of them waits for it."""
    doc = SQLModel.metadata.tables["document"]  # (models imports this module)
    found = session.execute(
        select(doc.c.dataset_id, doc.c.external_id).where(doc.c.id == document_id)
    ).first()
    named = col(SourceEntry.document_id) == document_id
    if found is not None and found.external_id is not None:
        versions = select(doc.c.id).where(
            doc.c.dataset_id == found.dataset_id, doc.c.external_id == found.external_id
        )
        named = or_(named, col(SourceEntry.document_id).in_(versions))
    query = select(SourceEntry.removed_at).where(named)
    if lock:
        query = query.with_for_update()
    removed = session.exec(query).all()
    return bool(removed) and all(at is not None for at in removed)


def last_run(session: Session, source_id: int) -> SourceRun | None:
    return session.exec(
        select(SourceRun)
        .where(SourceRun.source_id == source_id)
        .order_by(col(SourceRun.id).desc())
        .limit(1)
    ).first()


def mark_interrupted(session: Session, source_id: int) -> int:
    """Runs of this source still marked running when a new holder takes the lease: their process
    died (or lost the lease) halfway."""
    done = session.execute(
        update(SourceRun)
        .where(col(SourceRun.source_id) == source_id, col(SourceRun.status) == "running")
        .values(status="interrupted", finished_at=db_now(session))
    )
    return getattr(done, "rowcount", 0) or 0


def run_counts(run: SourceRun) -> dict[str, Any]:
    def iso(value: datetime | None) -> str | None:
        return value.isoformat() if value is not None else None

    return {
        "id": run.id,
        "status": run.status,
        "actor": run.actor,
        "started_at": iso(run.started_at),
        "finished_at": iso(run.finished_at),
        "listed": run.listed,
        "added": run.added,
        "changed": run.changed,
        "renamed": run.renamed,
        "removed": run.removed,
        "failed": run.failed,
        "unchanged": run.unchanged,
        "held": run.held,
        "message": run.message,
    }
