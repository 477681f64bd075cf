"""Pauses: the whole queue or one dataset stops starting jobs until resumed.

A pause is a row of the job database, so every worker and dispatcher sees the same state whatever
happened to Redis. While a pause covers a job's dataset, the claim refuses the job (a recorded
no-op; the job keeps waiting with an unsent outbox row), the dispatcher leaves its outbox rows
unsent and the recovery does not publish it again; resuming lets the dispatcher publish them. Jobs
already running finish; uploads are still accepted.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import delete, exists, or_
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, SQLModel, col, select

from sluice.storage.clock import db_now
from sluice.storage.db import matched
from sluice.storage.models import Dataset, Pause

WHOLE_QUEUE = "all"


def scope_of(dataset_id: int | None) -> str:
    return WHOLE_QUEUE if dataset_id is None else f"dataset:{int(dataset_id)}"


def covering(dataset_id: Any) -> Any:
    """SQL condition: a pause covers the dataset ``dataset_id`` (a column or a value). Made of the
    table's own columns, so that it keeps a statement on a table a plain (not ORM) one."""
    pause = SQLModel.metadata.tables["pause"]
    return exists().where(or_(pause.c.dataset_id.is_(None), pause.c.dataset_id == dataset_id))


def pause_for(*, session: Session, dataset_id: int | None) -> Pause | None:
    """The pause that stops the jobs of ``dataset_id`` (the whole queue's first), or None."""
    rows = session.exec(
        select(Pause)
        .where(or_(col(Pause.dataset_id).is_(None), col(Pause.dataset_id) == dataset_id))
        .order_by(col(Pause.dataset_id).is_not(None), col(Pause.id))
    ).all()
    return rows[0] if rows else None


def describe(pause: Pause, dataset_name: str | None = None) -> str:
    what = (
        "the whole queue"
        if pause.dataset_id is None
        else f"dataset {dataset_name or pause.dataset_id}"
    )
    why = f": {pause.reason}" if pause.reason else ""
    return f"paused ({what}, by {pause.paused_by} at {pause.paused_at:%Y-%m-%d %H:%M:%S} UTC{why})"


def pause(
    *, session: Session, dataset_id: int | None, actor: str, reason: str = ""
) -> tuple[Pause, bool]:
    """Pause the dataset (None: the whole queue). Returns the pause and whether this call made it
    (False: it was already paused, and that pause stays as it was)."""
    scope = scope_of(dataset_id)
    existing = session.exec(select(Pause).where(Pause.scope == scope)).first()
    if existing is not None:
        return existing, False
    row = Pause(
        scope=scope,
        dataset_id=dataset_id,
        paused_by=actor,
        paused_at=db_now(session),
        reason=reason.strip()[:2000],
    )
    session.add(row)
    try:
        session.commit()
    except IntegrityError:  # paused at the same moment by someone else: theirs stands
        session.rollback()
        return session.exec(select(Pause).where(Pause.scope == scope)).one(), False
    session.refresh(row)
    return row, True


def resume(*, session: Session, dataset_id: int | None) -> bool:
    """Lift the pause of the dataset (None: of the whole queue); False if there was none."""
    gone = matched(session, delete(Pause).where(col(Pause.scope) == scope_of(dataset_id)))
    session.commit()
    return bool(gone)


def active(*, session: Session) -> list[dict]:
    """Every pause in force, the whole queue first: what, who, when, why."""
    rows = session.exec(
        select(Pause, Dataset.name)
        .join(Dataset, col(Dataset.id) == Pause.dataset_id, isouter=True)
        .order_by(col(Pause.dataset_id).is_not(None), Dataset.name)
    ).all()
    return [
        {
            "scope": p.scope,
            "dataset_id": p.dataset_id,
            "dataset": name,
            "paused_by": p.paused_by,
            "paused_at": p.paused_at,
            "reason": p.reason,
            "text": describe(p, name),
        }
        for p, name in rows
    ]
