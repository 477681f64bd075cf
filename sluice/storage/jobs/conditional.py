"""The one way a job's row is written: a conditional UPDATE, made once with bound parameters.

A ``Condition`` is the WHERE of such an update, made once on the job table's columns, with its
values as bound parameters named ``w_*``. It writes in one of two ways. A compare-and-set
(``compare_and_set``) holds on the version the caller read, and refreshes the caller's object.
A fenced write (``fenced``) holds on the condition alone, such as the lease of a running attempt,
for a write that read nothing first. Either bumps the version. The UPDATE statements are kept per
set of columns written, so the hot path neither builds nor keys a statement again on each call.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import bindparam, update
from sqlalchemy.engine import Row
from sqlalchemy.orm.attributes import set_committed_value
from sqlmodel import Session, SQLModel

from sluice.storage import pauses
from sluice.storage.clock import current_time, db_now
from sluice.storage.db import matched
from sluice.storage.jobs.statuses import CLAIMABLE, RETRYABLE
from sluice.storage.models import Job, JobStatus

JOB = SQLModel.metadata.tables["job"]
"""The job table: plain UPDATEs of it skip the ORM's bulk-update machinery."""


class DatabaseTime:
    """A value that writes the database's own time into its column (``NOW``)."""

    def __repr__(self) -> str:
        return "NOW"


NOW = DatabaseTime()


@dataclass(frozen=True, eq=False)
class Condition:
    """The WHERE of a conditional update of a job's row, and its statements, each made once."""

    clauses: tuple[Any, ...]
    statements: dict[tuple[Any, ...], Any] = field(default_factory=dict, repr=False)

    def statement(
        self, keys: tuple[str, ...], *, versioned: bool, returning: tuple[str, ...] = ()
    ) -> Any:
        """The UPDATE of the columns ``keys``, kept for the next call of the same shape."""
        shape = (keys, versioned, returning)
        stmt = self.statements.get(shape)
        if stmt is None:  # two threads may both make it: the same statement, one kept
            stmt = self.statements[shape] = _make(self.clauses, keys, versioned, returning)
        return stmt


def _make(
    clauses: tuple[Any, ...], keys: tuple[str, ...], versioned: bool, returning: tuple[str, ...]
) -> Any:
    """Build one UPDATE: a key ending in ``=now`` writes the database's time into its column."""
    values: dict[str, Any] = {}
    for key in keys:
        name, _, now = key.partition("=")
        values[name] = current_time() if now else bindparam(f"v_{name}")
    where = [JOB.c.id == bindparam("c_id"), *clauses]
    if versioned:
        where.append(JOB.c.version == bindparam("c_version"))
        values["version"] = bindparam("c_next")
    else:
        values["version"] = JOB.c.version + 1
    stmt = update(JOB).where(*where).values(values)
    return stmt.returning(*(JOB.c[name] for name in returning)) if returning else stmt


ANY_STATUS = Condition(())
CLAIMABLE_NOW = Condition((JOB.c.status.in_(CLAIMABLE),))
CLAIMABLE_UNPAUSED = Condition((JOB.c.status.in_(CLAIMABLE), ~pauses.covering(JOB.c.dataset_id)))
RETRYABLE_NOW = Condition((JOB.c.status.in_(RETRYABLE),))
IN_STATUS = Condition((JOB.c.status == bindparam("w_status"),))
IN_STATUS_OF_VERSION = Condition(
    (JOB.c.status == bindparam("w_status"), JOB.c.pipeline_version == bindparam("w_version"))
)
RUNNING = Condition((JOB.c.status == JobStatus.running,))
ON_LEASE = Condition((JOB.c.lease == bindparam("w_lease"),))
RUNNING_ON_LEASE = Condition(
    (JOB.c.lease == bindparam("w_lease"), JOB.c.status == JobStatus.running)
)
RUNNING_UNCANCELLED = Condition(
    (
        JOB.c.lease == bindparam("w_lease"),
        JOB.c.status == JobStatus.running,
        JOB.c.cancel_requested.is_(False),
    )
)


def matched_made_once(session: Session, statement: Any, params: dict[str, Any]) -> int:
    """The rows a statement made once on a table matched. What the session holds is written first,
    as an ORM statement's autoflush would have, so a transaction writes in the same order."""
    session.flush()
    return matched(session, statement, params)


def _bound(values: Mapping[str, Any]) -> tuple[tuple[str, ...], dict[str, Any]]:
    """The statement's keys for ``values`` and their parameters."""
    keys = tuple(sorted(f"{k}=now" if v is NOW else k for k, v in values.items()))
    return keys, {f"v_{k}": v for k, v in values.items() if v is not NOW}


def compare_and_set(
    session: Session,
    job: Job,
    where: Condition = ANY_STATUS,
    *,
    bound: dict[str, Any] | None = None,
    now: datetime | None = None,
    **values: Any,
) -> bool:
    """Update ``job`` only if its version is still the one read and ``where`` holds (``bound``
    gives its parameters); refresh the object when it lands."""
    values.setdefault("updated_at", now or db_now(session))
    keys, params = _bound(values)
    params.update(c_id=job.id, c_version=job.version, c_next=job.version + 1, **(bound or {}))
    if matched_made_once(session, where.statement(keys, versioned=True), params) != 1:
        return False
    # The row holds these values now: set them as loaded, not as changes (a plain setattr would make
    # the session write the same values again, unfenced, at the next flush).
    for key, value in {**values, "version": job.version + 1}.items():
        set_committed_value(job, key, value)
    return True


def fenced(
    session: Session,
    job_id: int,
    where: Condition,
    *,
    bound: dict[str, Any] | None = None,
    returning: tuple[str, ...] = ("id",),
    **values: Any,
) -> Row[Any] | None:
    """Update the job ``job_id`` while ``where`` holds, with no version read first: the columns
    ``returning`` names as written, or None when it did not hold."""
    values.setdefault("updated_at", NOW)
    keys, params = _bound(values)
    params.update(c_id=job_id, **(bound or {}))
    session.flush()  # as in matched_made_once
    stmt = where.statement(keys, versioned=False, returning=returning)
    return session.execute(stmt, params).first()
