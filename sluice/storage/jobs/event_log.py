"""A job's event log: the JobEvent each transition writes in its own transaction."""

from __future__ import annotations

from typing import Any

from sqlmodel import Session

from sluice.storage.models import STAGE_UNITS, Job, JobEvent, JobStatus, Stage


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
) -> JobEvent:
    event = JobEvent(
        job_id=job.id,
        kind=kind,
        message=message,
        actor=actor,
        from_status=value_of(from_status),
        to_status=value_of(to_status),
        stage=value_of(job.stage),
        attempt=job.attempt,
        data=data or {},
    )
    session.add(event)
    return event


def value_of(v: Any) -> Any:
    """An enum's value, or the value itself."""
    return v.value if hasattr(v, "value") else v
