"""The operator's transitions: cancel, retry, priority, reindex, dismiss, revive, a fix refused.

Each job of a request is its own compare-and-set and its own result line.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from sqlalchemy import func, update
from sqlmodel import Session, col, select

from sluice.errors import ErrorKind
from sluice.storage import models
from sluice.storage.db import matched
from sluice.storage.jobs.conditional import (
    CLAIMABLE_NOW,
    IN_STATUS,
    RETRYABLE_NOW,
    RUNNING,
    compare_and_set,
    fenced,
)
from sluice.storage.jobs.endings import cancelled
from sluice.storage.jobs.event_log import add_event, describe_progress
from sluice.storage.jobs.job_values import ActionResult
from sluice.storage.jobs.lookups import get_job, load_many
from sluice.storage.jobs.outbox_row import publish
from sluice.storage.jobs.statuses import CLAIMABLE, RETRYABLE
from sluice.storage.models import Job, JobStatus, Stage


def request_cancel(*, session: Session, job_ids: Iterable[int], actor: str) -> list[ActionResult]:
    results = []
    for jid, job in load_many(session, job_ids):
        if job is None:
            results.append(ActionResult(jid, False, f"job {jid} does not exist"))
        elif job.status in (JobStatus.pending, JobStatus.retrying):
            done = cancelled(session, job, actor=actor)
            results.append(
                ActionResult(
                    jid,
                    done is not None,
                    f"job {jid} cancelled before it ran"
                    if done
                    else f"job {jid} changed meanwhile; try again",
                )
            )
        elif job.status == JobStatus.running:
            results.append(_cancel_running(session, job, actor=actor))
        else:
            results.append(
                ActionResult(
                    jid,
                    False,
                    f"job {jid} is {job.status.value}; only pending, "
                    "retrying or running jobs can be cancelled",
                )
            )
    return results


def _cancel_running(session: Session, job: Job, *, actor: str) -> ActionResult:
    """A running job is asked to stop: its worker does at its next batch."""
    jid = job.id
    if job.cancel_requested:
        return ActionResult(jid, True, f"job {jid}: cancel already requested")
    # Not on the version: the job's own heartbeat bumps it several times a second.
    ok = fenced(session, jid, RUNNING, cancel_requested=True) is not None
    if ok:
        add_event(
            session,
            job,
            "cancel_requested",
            actor=actor,
            message=f"cancel requested at {describe_progress(job.stage, job.done, job.total)}",
        )
    session.commit()
    return ActionResult(
        jid,
        ok,
        f"job {jid} is running; it stops at its next batch and its vectors are removed"
        if ok
        else f"job {jid} changed meanwhile; try again",
    )


def retry(
    *, session: Session, job_ids: Iterable[int], actor: str, reason: str = "manual retry"
) -> list[ActionResult]:
    """failed/cancelled -> pending with a fresh attempt budget, published again."""
    results = []
    for jid, job in load_many(session, job_ids):
        refusal = _retry_refused(jid, job)
        if refusal is not None:
            results.append(refusal)
            continue
        assert job is not None
        before = job.status
        ok = compare_and_set(
            session,
            job,
            RETRYABLE_NOW,
            status=JobStatus.pending,
            stage=Stage.queued,
            done=0,
            total=0,
            attempt=0,
            next_attempt_at=None,
            finished_at=None,
            dismissed=False,
            cancel_requested=False,
            error_kind=None,
            error_code=None,
            error_message=None,
            fix_hint=None,
            error_detail=None,
            waiting_for=None,
            waiting_since=None,
        )
        if ok:
            add_event(
                session,
                job,
                "retried",
                actor=actor,
                from_status=before,
                to_status=JobStatus.pending,
                message=reason,
            )
            publish(session, job)
        session.commit()
        results.append(
            ActionResult(
                jid,
                ok,
                f"job {jid} queued again ({reason})"
                if ok
                else f"job {jid} changed meanwhile; try again",
            )
        )
    return results


def _retry_refused(jid: int, job: Job | None) -> ActionResult | None:
    """Why ``job`` cannot be retried (None: it can)."""
    if job is None:
        return ActionResult(jid, False, f"job {jid} does not exist")
    if job.status == JobStatus.succeeded:
        return ActionResult(
            jid,
            False,
            f"job {jid} has already succeeded; retry refused. "
            "Use reindex to rebuild its chunks on purpose.",
        )
    if job.status not in RETRYABLE:
        return ActionResult(
            jid,
            False,
            f"job {jid} is {job.status.value}; only failed or cancelled jobs can be retried",
        )
    return None


def set_priority(
    *,
    session: Session,
    job_ids: Iterable[int],
    actor: str,
    priority: int | None,
    verb: str = "priority set",
) -> list[ActionResult]:
    """Give waiting jobs a priority (higher is published first; None: their dataset's again)."""
    results = []
    for jid, job in load_many(session, job_ids):
        if job is None or job.status not in CLAIMABLE:
            state = "does not exist" if job is None else f"is {job.status.value}"
            results.append(
                ActionResult(
                    jid,
                    False,
                    f"job {jid} {state}; only waiting jobs (pending, "
                    "retrying) can be moved in the queue",
                )
            )
            continue
        before = job.priority
        ok = compare_and_set(session, job, CLAIMABLE_NOW, priority=priority)
        if ok:
            add_event(
                session,
                job,
                "priority",
                actor=actor,
                message=f"{verb}: {priority}",
                data={"from": before, "to": priority},
            )
        session.commit()
        results.append(
            ActionResult(
                jid,
                ok,
                f"job {jid}: {verb} ({priority})"
                if ok
                else f"job {jid} changed meanwhile; try again",
            )
        )
    return results


def run_next(*, session: Session, job_ids: Iterable[int], actor: str) -> list[ActionResult]:
    """Move waiting jobs to the front: a priority above every other waiting job's."""
    top = (
        session.execute(
            select(func.max(func.coalesce(Job.priority, models.Dataset.priority, 0)))
            .join(models.Dataset, col(models.Dataset.id) == Job.dataset_id)
            .where(col(Job.status).in_(CLAIMABLE))
        ).scalar()
        or 0
    )
    return set_priority(
        session=session, job_ids=job_ids, actor=actor, priority=top + 1, verb="run next"
    )


def set_dataset_priority(*, session: Session, dataset_id: int, priority: int | None) -> bool:
    """The priority of a dataset's jobs that have none of their own (None: the default, 0)."""
    done = matched(
        session,
        update(models.Dataset)
        .where(col(models.Dataset.id) == dataset_id)
        .values(priority=priority),
    )
    session.commit()
    return bool(done)


def _from_status(
    session: Session,
    job_ids: Iterable[int],
    *,
    source: JobStatus,
    refusal: str,
    event: str,
    actor: str,
    reason: str,
    said: Callable[[Job], str],
    publish_it: bool,
    **change: Any,
) -> list[ActionResult]:
    """One operator transition out of ``source`` for each job, by compare-and-set; each a result
    line."""
    results = []
    for jid, job in load_many(session, job_ids):
        if job is None or job.status != source:
            state = "does not exist" if job is None else f"is {job.status.value}"
            results.append(ActionResult(jid, False, f"job {jid} {state}; {refusal}"))
            continue
        ok = compare_and_set(session, job, IN_STATUS, bound={"w_status": source}, **change)
        if ok:
            to_status = change.get("status")
            add_event(
                session,
                job,
                event,
                actor=actor,
                from_status=source if to_status else None,
                to_status=to_status,
                message=reason,
            )
            if publish_it:
                publish(session, job)
        session.commit()
        results.append(ActionResult(jid, ok, said(job) if ok else f"job {jid} changed meanwhile"))
    return results


def reindex(
    *, session: Session, job_ids: Iterable[int], actor: str, reason: str = "reindex"
) -> list[ActionResult]:
    """succeeded -> pending: rebuild the same chunks on purpose; search keeps serving the old
    ones."""
    return _from_status(
        session,
        job_ids,
        source=JobStatus.succeeded,
        event="reindex_requested",
        actor=actor,
        reason=reason,
        refusal="only succeeded jobs can be reindexed",
        publish_it=True,
        said=lambda job: f"job {job.id} queued for reindex",
        **{
            "status": JobStatus.pending,
            "stage": Stage.queued,
            "done": 0,
            "total": 0,
            "attempt": 0,
            "finished_at": None,
        },
    )


def dismiss(*, session: Session, job_ids: Iterable[int], actor: str) -> list[ActionResult]:
    """Hide a dead letter from the dead-letter list (it stays failed, with its history)."""
    return _from_status(
        session,
        job_ids,
        source=JobStatus.failed,
        event="dismissed",
        actor=actor,
        reason="dismissed from dead letters",
        refusal="only a dead letter can be dismissed",
        publish_it=False,
        said=lambda job: f"job {job.id} dismissed",
        dismissed=True,
    )


def revive(
    *,
    session: Session,
    job_ids: Iterable[int],
    actor: str,
    reason: str = "pipeline version in force again",
) -> list[ActionResult]:
    """superseded -> pending: the settings went back to this job's pipeline version, so build it
    again (its chunks were removed when it was superseded). Search keeps serving the document's
    active job until this one succeeds and takes over."""
    return _from_status(
        session,
        job_ids,
        source=JobStatus.superseded,
        event="revived",
        actor=actor,
        reason=reason,
        refusal="only superseded jobs can be revived",
        publish_it=True,
        said=lambda job: f"job {job.id} queued to build pipeline {job.pipeline_version} again",
        **{
            "status": JobStatus.pending,
            "stage": Stage.queued,
            "done": 0,
            "total": 0,
            "attempt": 0,
            "finished_at": None,
            "next_attempt_at": None,
            "cancel_requested": False,
        },
    )


def action_rejected(
    *, session: Session, job_id: int, actor: str, code: str, message: str, hint: str
) -> bool:
    """A failed job whose fix the operator tried, and that fix did not work (a wrong password): it
    stays failed as user_action_required, and its error now says why. False if it is not failed."""
    job = get_job(session=session, job_id=job_id)
    if job is None or job.status != JobStatus.failed:
        return False
    ok = compare_and_set(
        session,
        job,
        IN_STATUS,
        bound={"w_status": JobStatus.failed},
        error_kind=ErrorKind.user_action_required,
        error_code=code,
        error_message=message,
        fix_hint=hint,
        error_detail=None,
    )
    if ok:
        add_event(
            session, job, "action_rejected", actor=actor, message=message, data={"code": code}
        )
    session.commit()
    return ok
