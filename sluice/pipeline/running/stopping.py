"""A worker's ordered stop (SIGTERM or SIGINT): it takes no new job, lets the running ones finish
within its grace, and hands back what it still holds, so nothing is left running for the reaper
and no failure is recorded that is only the stop's (a service stopping beside it included)."""

from __future__ import annotations

import logging
import threading

from sqlmodel import Session

from sluice.pipeline.running.context import Context
from sluice.storage import jobs

log = logging.getLogger(__name__)

_stopping = threading.Event()


def request() -> None:
    """From now on this process takes no job, and an attempt that fails is handed back instead."""
    _stopping.set()


def requested() -> bool:
    return _stopping.is_set()


def reset() -> None:
    """For tests: the process may take jobs again."""
    _stopping.clear()


def hand_back_all(ctx: Context, reason: str = "the worker stopped") -> list[int]:
    """Hand back every job still running on this worker (fenced on each lease: an attempt that
    writes afterwards finds it is no longer its own). Returns the job ids handed back."""
    done: list[int] = []
    with Session(ctx.engine, expire_on_commit=False) as session:
        for job_id, lease in jobs.running_on(session=session, worker_id=ctx.worker_id):
            job = jobs.hand_back(
                session=session,
                job_id=job_id,
                lease=lease,
                worker_id=ctx.worker_id,
                reason=reason,
            )
            if job is not None:
                done.append(job_id)
    if done:
        log.info("handed back %s as the worker stopped", ", ".join(map(str, done)))
    return done
