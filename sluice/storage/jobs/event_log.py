"""A job's event log: the JobEvent each transition writes in its own transaction.

An event is one INSERT made once with bound parameters, executed where the transition writes it:
no ``JobEvent`` object is built or flushed through the unit of work (that was most of what an
event cost a tiny job). Whoever needs to see the events a session writes (the audit trail)
listens for ``INSERT_EVENT`` being executed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import CursorResult, insert
from sqlmodel import Session, SQLModel

from sluice.storage.models import STAGE_UNITS, Job, JobStatus, Stage, utcnow

EVENTS = SQLModel.metadata.tables["job_event"]
INSERT_EVENT = insert(EVENTS)
"""The one INSERT of a job event, made once: its parameters name every column but ``id``."""


@dataclass(frozen=True)
class LoggedEvent:
    """An event as written: its id (the webhooks' event id), its job and its kind."""

    id: int
    job_id: int
    kind: str


def describe_progress(stage: Stage | str, done: int, total: int) -> str:
    stage = Stage(stage)
    unit = STAGE_UNITS.get(stage)
    if unit and total:
        return f"{stage.value} {done}/{total} {unit}"
    return stage.value


def add_event(
    session: Session,
    job: Job,
    kind: str,
    *,
    message: str = "",
    actor: str = "system",
    from_status: JobStatus | str | None = None,
    to_status: JobStatus | str | None = None,
    data: dict[str, Any] | None = None,
) -> LoggedEvent:
    """The event ``kind`` of ``job``, at its stage and attempt, in the session's transaction."""
    return log_event(
        session,
        job.id,
        kind,
        stage=job.stage,
        attempt=job.attempt,
        message=message,
        actor=actor,
        from_status=from_status,
        to_status=to_status,
        data=data,
    )


def log_event(
    session: Session,
    job_id: int,
    kind: str,
    *,
    stage: Stage | str | None,
    attempt: int | None,
    message: str = "",
    actor: str = "system",
    from_status: JobStatus | str | None = None,
    to_status: JobStatus | str | None = None,
    data: dict[str, Any] | None = None,
) -> LoggedEvent:
    """``add_event`` for a job known by its id (a fenced write read no object)."""
    session.flush()  # what the session holds goes first, as it did when events were flushed
    params = {
        "job_id": job_id,
        "at": utcnow(),
        "kind": kind,
        "from_status": value_of(from_status),
        "to_status": value_of(to_status),
        "stage": value_of(stage),
        "attempt": attempt,
        "actor": actor,
        "message": message,
        "data": data or {},
    }
    written = cast(CursorResult[Any], session.execute(INSERT_EVENT, params))
    return LoggedEvent(_new_id(written), job_id, kind)


def _new_id(written: CursorResult[Any]) -> int:
    """The id an INSERT of one row handed out."""
    key = written.inserted_primary_key
    assert key is not None
    return int(key[0])


def value_of(v: Any) -> Any:
    """An enum's value, or the value itself."""
    return v.value if hasattr(v, "value") else v
