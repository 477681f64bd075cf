"""Periodic recovery: take back stalled jobs, publish the outbox, re-publish stranded jobs.

Together these make the job database, not the queue, the source of truth: a Redis outage, a flushed
queue or a worker killed mid-job delays jobs but never strands them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from sqlmodel import Session

from sluice.pipeline.context import Context
from sluice.storage import jobs, outbox

log = logging.getLogger(__name__)


@dataclass
class RecoveryReport:
    reaped: list[int] = field(default_factory=list)
    published: list[int] = field(default_factory=list)
    republished: list[int] = field(default_factory=list)
    publish_error: str | None = None

    @property
    def anything(self) -> bool:
        return bool(self.reaped or self.published or self.republished or self.publish_error)


def run_once(ctx: Context, *, publish: Callable[[int], None],
             queued_job_ids: Callable[[], list[int]] | None = None) -> RecoveryReport:
    s = ctx.settings
    report = RecoveryReport()
    with Session(ctx.engine) as session:
        report.reaped = jobs.reap(session=session, lease_seconds=s.lease_seconds,
                                  base_delay=s.retry_base_seconds, max_delay=s.retry_max_seconds)
    if queued_job_ids is not None:
        try:
            queued = set(queued_job_ids())
        except Exception as exc:  # the queue is down: nothing can be told stranded now
            report.publish_error = f"{type(exc).__name__}: {exc}"
            queued = None
        if queued is not None:
            with Session(ctx.engine) as session:
                report.republished = outbox.redeliver_stranded(
                    session=session, older_than_seconds=s.redeliver_after_seconds, queued_job_ids=queued)
    sent = outbox.dispatch(engine=ctx.engine, publish=publish)
    report.published = sent.sent
    report.publish_error = sent.error or report.publish_error
    return report
