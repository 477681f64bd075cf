"""Pause and resume the whole queue or one dataset, for both front ends (see sluice.storage.pauses).

Pausing and resuming are operator actions (refused to a read-only operator); anyone may read what is
paused. Resuming publishes at once what waited, through the outbox.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlmodel import Session, select

from sluice.ops import audit_trail
from sluice.ops.access import Operator, ReadOnlyOperator, require_operator
from sluice.ops.reads import ctx
from sluice.pipeline.queueing.publishing import dispatch_now
from sluice.storage import pauses
from sluice.storage.models import Pause
from sluice.storage.queries import dataset_names


@dataclass(frozen=True)
class PauseResult:
    ok: bool
    message: str
    queue_note: str = ""


def _what(dataset_id: int | None) -> str:
    if dataset_id is None:
        return "the whole queue"
    with Session(ctx().engine) as session:
        return f"dataset {dataset_names(session=session).get(dataset_id, dataset_id)}"


def pause(who: Operator, *, dataset_id: int | None = None, reason: str = "") -> PauseResult:
    """Stop starting jobs of the dataset (None: of every dataset); running jobs finish."""
    what = {"target_kind": "queue", "target_id": pauses.scope_of(dataset_id)}
    try:
        require_operator(who, "pause the queue")
    except ReadOnlyOperator as exc:
        audit_trail.refused(who, "queue.pause", str(exc), **what)
        return PauseResult(False, str(exc))
    with (
        audit_trail.recording(
            who, "queue.pause", params={"reason": reason}, model=Pause, **what
        ) as rec,
        Session(ctx().engine) as session,
    ):
        row, made = pauses.pause(
            session=session, dataset_id=dataset_id, actor=who.actor, reason=reason
        )
        text = pauses.describe(
            row, None if dataset_id is None else _what(dataset_id).removeprefix("dataset ")
        )
    rec.settle(True, "already paused")
    if not made:
        return PauseResult(True, f"{_what(dataset_id)} was already {text}")
    return PauseResult(
        True, f"{_what(dataset_id)} is {text}; running jobs finish, uploads are still accepted"
    )


def resume(who: Operator, *, dataset_id: int | None = None) -> PauseResult:
    """Lift the pause of the dataset (None: of the whole queue) and publish what waited."""
    what = {"target_kind": "queue", "target_id": pauses.scope_of(dataset_id)}
    try:
        require_operator(who, "resume the queue")
    except ReadOnlyOperator as exc:
        audit_trail.refused(who, "queue.resume", str(exc), **what)
        return PauseResult(False, str(exc))
    with Session(ctx().engine) as session:
        held = pauses.pause_for(session=session, dataset_id=dataset_id) is not None

    def lifted_now(s: Session) -> bool:
        return held and not _in_force(s, dataset_id)

    with (
        audit_trail.recording(who, "queue.resume", check=lifted_now, **what) as rec,
        Session(ctx().engine) as session,
    ):
        lifted = pauses.resume(session=session, dataset_id=dataset_id)
    rec.settle(lifted, "" if lifted else "not paused", code="not_paused")
    if not lifted:
        return PauseResult(False, f"{_what(dataset_id)} was not paused")
    note = dispatch_now(ctx().engine)[1]
    left = active()
    more = f"; still in force: {'; '.join(p['text'] for p in left)}" if left else ""
    return PauseResult(True, f"{_what(dataset_id)} resumed{more}", note)


def _in_force(session: Session, dataset_id: int | None) -> bool:
    """Whether the very pause of this scope is still there (not one that covers it)."""
    return (
        session.exec(select(Pause).where(Pause.scope == pauses.scope_of(dataset_id))).first()
        is not None
    )


def active() -> list[dict]:
    """Every pause in force: scope, dataset, paused_by, paused_at, reason, text."""
    with Session(ctx().engine) as session:
        return pauses.active(session=session)
