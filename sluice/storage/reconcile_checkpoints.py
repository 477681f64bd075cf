"""Reconcile's checkpoint of each dataset: what the last repairing pass judged, so that the next
pass can read only the chunks of the jobs that changed since (``reconcile --changed``).

One row per dataset: for each prefix of the chunk ids a job makes, a short digest of the job as
reconcile judges it and its chunk count (``Fingerprint``), as zlib-compressed text lines. Written
only by a repairing pass that ended without errors for the dataset. No foreign key: a dataset's
delete removes its rows in steps and must not be blocked here; a row whose dataset is gone is
dropped by the next save of any dataset (dataset ids are never used again).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Column, LargeBinary, text
from sqlalchemy.exc import IntegrityError
from sqlmodel import Field, Session, SQLModel

from sluice.storage.clock import as_utc, db_now

# prefix -> (digest of the job as judged, its chunk count, 0 when it has none)
Fingerprint = dict[str, tuple[bytes, int]]


class ReconcileCheckpoint(SQLModel, table=True):
    __tablename__ = "reconcile_checkpoint"

    dataset_id: int = Field(primary_key=True, sa_column_kwargs={"autoincrement": False})
    collection: str = Field(max_length=80)  # a rebuilt collection is a new one: a full pass
    jobs: int = 0  # entries in the fingerprint
    fingerprint: bytes = Field(sa_column=Column(LargeBinary, nullable=False))
    saved_at: datetime
    saved_by: str = Field(default="system", max_length=120)
    full_at: datetime | None = None  # the last full repairing pass that ended without errors


@dataclass
class Checkpoint:
    """A dataset's checkpoint as read: its fingerprint decoded."""

    collection: str
    entries: Fingerprint
    saved_at: datetime
    full_at: datetime | None

    def full_older_than(self, hours: float, now: datetime) -> bool:
        """Whether the last full pass is older than ``hours`` (or there has been none)."""
        return self.full_at is None or now - self.full_at >= timedelta(hours=hours)


def encode(entries: Fingerprint) -> bytes:
    lines = "".join(f"{p}\t{d.hex()}\t{n}\n" for p, (d, n) in sorted(entries.items()))
    return zlib.compress(lines.encode(), 6)


def decode(blob: bytes) -> Fingerprint:
    out: Fingerprint = {}
    for line in zlib.decompress(blob).decode().splitlines():
        prefix, digest, count = line.split("\t")
        out[prefix] = (bytes.fromhex(digest), int(count))
    return out


def load(session: Session, dataset_id: int) -> Checkpoint | None:
    row = session.get(ReconcileCheckpoint, dataset_id)
    if row is None:
        return None
    return Checkpoint(
        row.collection,
        decode(row.fingerprint),
        as_utc(row.saved_at),
        as_utc(row.full_at) if row.full_at is not None else None,
    )


def save(
    session: Session,
    dataset_id: int,
    collection: str,
    entries: Fingerprint,
    *,
    full: bool,
    actor: str,
) -> None:
    """Replace the dataset's checkpoint (a full pass also marks the time of the last full one).
    Two passes saving at once: the last one wins, and either is a state a pass judged."""
    for attempt in range(2):
        at = db_now(session)
        row = session.get(ReconcileCheckpoint, dataset_id)
        if row is None:
            row = ReconcileCheckpoint(
                dataset_id=dataset_id, collection=collection, fingerprint=b"", saved_at=at
            )
        row.collection, row.jobs, row.fingerprint = collection, len(entries), encode(entries)
        row.saved_at, row.saved_by = at, actor[:120]
        if full:
            row.full_at = at
        session.add(row)
        session.execute(_FORGET_GONE)
        try:
            session.commit()
            return
        except IntegrityError:  # another pass made the row at the same moment: write over it
            session.rollback()
            if attempt:
                raise


_FORGET_GONE = text(
    "DELETE FROM reconcile_checkpoint WHERE dataset_id NOT IN (SELECT id FROM dataset)"
)
