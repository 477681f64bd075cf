"""Idempotency records of the HTTP API: the first answer to a POST, per API key and
``Idempotency-Key``, kept for ``TTL`` (the retention job removes older ones:
``sluice.storage.retention``).

``claim`` decides what a request with a key is: the first (a row is added, in flight), a replay of
a finished first (same fingerprint), another request under a used key (another fingerprint), or a
second request while the first still runs. Two requests that claim the same key at the same moment
meet at the unique constraint: one adds the row, the other reads it. A first request that can no
longer finish (its process is gone, or ``IN_FLIGHT_LIMIT`` passed) leaves its row to the next
request with the same key, taken over by compare-and-set, so a crash never locks a key for a day.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cache
from pathlib import Path
from typing import Any, Literal, cast

from sqlalchemy import CursorResult, delete, func, update
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from sluice import faults
from sluice.storage.clock import as_utc, db_now
from sluice.storage.models import IdempotencyRecord

TTL = timedelta(hours=24)
IN_FLIGHT_LIMIT = timedelta(minutes=10)  # longer than any answer takes: its process died elsewhere
Verdict = Literal["first", "replay", "other_request", "in_flight"]


@dataclass(frozen=True)
class Claim:
    verdict: Verdict
    record_id: int
    status_code: int | None = None
    headers: dict[str, Any] | None = None
    body: str | None = None


def _start_time(pid: int) -> str | None:
    """When a process started, in clock ticks since boot (field 22 of /proc/PID/stat): with the
    pid it names one process, never a later one that got the same pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rpartition(")")[2].split()[19]


@cache
def this_process() -> str:
    """This process as an in-flight record's owner: host, pid and start time."""
    return f"{socket.gethostname()}:{os.getpid()}:{_start_time(os.getpid()) or '?'}"


def _owner_gone(owner: str | None) -> bool:
    """Whether the process that owns a record is known to be gone (only a process of this host can
    be looked at; one elsewhere waits out ``IN_FLIGHT_LIMIT``)."""
    if not owner:
        return False
    host, _, rest = owner.partition(":")
    pid, _, started = rest.partition(":")
    if host != socket.gethostname() or not pid.isdigit() or started == "?":
        return False
    return _start_time(int(pid)) != started


def _take_over(session: Session, row: IdempotencyRecord, now: datetime) -> bool:
    """Make a dead first request's row this request's, if nobody did meanwhile."""
    took = session.execute(
        update(IdempotencyRecord)
        .where(
            col(IdempotencyRecord.id) == row.id,
            col(IdempotencyRecord.status_code).is_(None),
            col(IdempotencyRecord.created_at) == row.created_at,
        )
        .values(owner=this_process(), created_at=now)
    )
    session.commit()
    return cast("CursorResult[Any]", took).rowcount == 1


def _verdict(row: IdempotencyRecord, fingerprint: str) -> Claim:
    if row.fingerprint != fingerprint:
        return Claim("other_request", row.id or 0)
    if row.status_code is None:
        return Claim("in_flight", row.id or 0)
    return Claim("replay", row.id or 0, row.status_code, dict(row.headers or {}), row.body)


def _find(session: Session, key_id: int, idempotency_key: str) -> IdempotencyRecord | None:
    return session.exec(
        select(IdempotencyRecord).where(
            IdempotencyRecord.key_id == key_id,
            IdempotencyRecord.idempotency_key == idempotency_key,
        )
    ).first()


def claim(*, session: Session, key_id: int, idempotency_key: str, fingerprint: str) -> Claim:
    """The verdict on a request; for ``first``, a row in flight is added (``complete`` or
    ``release`` it)."""
    now = db_now(session)
    row = _find(session, key_id, idempotency_key)
    if row is not None and as_utc(row.created_at) < now - TTL:  # expired: as if it were gone
        session.execute(delete(IdempotencyRecord).where(col(IdempotencyRecord.id) == row.id))
        session.commit()
        row = None
    if row is not None:
        verdict = _verdict(row, fingerprint)
        abandoned = _owner_gone(row.owner) or as_utc(row.created_at) < now - IN_FLIGHT_LIMIT
        if verdict.verdict == "in_flight" and abandoned and _take_over(session, row, now):
            return Claim("first", row.id or 0)
        return verdict
    faults.hit("idempotency_before_insert", key_id=key_id, idempotency_key=idempotency_key)
    row = IdempotencyRecord(
        key_id=key_id,
        idempotency_key=idempotency_key,
        fingerprint=fingerprint,
        created_at=now,
        owner=this_process(),
    )
    session.add(row)
    try:
        session.commit()
    except IntegrityError:  # another request with the same key added its row first
        session.rollback()
        other = _find(session, key_id, idempotency_key)
        if other is None:  # it was released in between: this one is not the first either
            return Claim("in_flight", 0)
        return _verdict(other, fingerprint)
    return Claim("first", row.id or 0)


def complete(
    *,
    session: Session,
    record_id: int,
    status_code: int,
    headers: dict[str, str],
    body: str,
    now: datetime | None = None,
) -> None:
    """Keep the first answer, to be replayed."""
    session.execute(
        update(IdempotencyRecord)
        .where(col(IdempotencyRecord.id) == record_id)
        .values(
            status_code=status_code,
            headers=headers,
            body=body,
            completed_at=now or db_now(session),
        )
    )
    session.commit()


def prune(*, session: Session, dry_run: bool, now: datetime | None = None) -> int:
    """Records older than ``TTL`` (a request treats its own expired record as gone; the retention
    job removes them all): how many went, or would go."""
    old = col(IdempotencyRecord.created_at) < (now or db_now(session)) - TTL
    if dry_run:
        return int(
            session.exec(select(func.count()).select_from(IdempotencyRecord).where(old)).one()
        )
    gone = cast("CursorResult[Any]", session.execute(delete(IdempotencyRecord).where(old))).rowcount
    session.commit()
    return int(gone)


def release(*, session: Session, record_id: int) -> None:
    """Forget a claim whose request ended without an answer worth keeping (a server error): the
    client may try again with the same key."""
    session.execute(delete(IdempotencyRecord).where(col(IdempotencyRecord.id) == record_id))
    session.commit()
