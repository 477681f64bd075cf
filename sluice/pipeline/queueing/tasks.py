"""The task that runs a job, on the one Huey instance: thin, it takes a job id and calls a plain
function. Queue messages carry only the id; the job database says what to do with it."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import redis

from sluice.pipeline.queueing import recovery
from sluice.pipeline.queueing.broker import (
    dispatch_now,
    dispatch_window,
    get_huey,
    queued_job_ids,
)
from sluice.pipeline.running import stopping
from sluice.pipeline.running.context import get_context
from sluice.pipeline.running.runner import run_job
from sluice.settings import redact_url
from sluice.storage.models import JobStatus

log = logging.getLogger("sluice.tasks")

huey = get_huey()


FOREIGN_RETRY_SECONDS = 1.0


@huey.task(name="sluice.process_job")
def process_job(job_id: int, instance_id: str | None = None) -> None:
    """Run a job of this instance. A message of another instance (its own job database on the same
    queue) is refused loudly and put back for its owner; a message without an instance id is from
    a Sluice before instance ids and is taken as ours."""
    ctx = get_context()
    if instance_id is not None and instance_id != ctx.instance_id:
        log.error(
            "refused a message for job %s of instance %s: this worker belongs to instance %s. Two "
            "Sluice instances share the queue %r on %s; give each its own SLUICE_QUEUE_NAME. The "
            "message goes back on the queue for its owner.",
            job_id,
            instance_id,
            ctx.instance_id,
            ctx.settings.queue_name,
            redact_url(ctx.settings.queue_redis_url),
        )
        process_job.schedule(args=(job_id, instance_id), delay=FOREIGN_RETRY_SECONDS)
        return
    if stopping.requested():  # taken off the queue as the worker stops: back on it, untouched
        try:
            process_job.schedule(args=(job_id, instance_id), delay=FOREIGN_RETRY_SECONDS)
        except redis.RedisError as exc:  # recovery publishes a job whose message was lost
            log.warning("job %s: not put back on the queue (%s)", job_id, exc)
        return
    # The claim took this message off the queue's window: publish the next one the dispatcher
    # chooses.
    outcome = run_job(
        int(job_id), ctx=ctx, after_claim=lambda: dispatch_now(ctx.engine, via=publish)
    )
    if outcome.result == JobStatus.retrying.value:  # its outbox row comes due after the backoff:
        recovery.ALARM.ring()  # the worker's loop publishes it then, not at its next round


def publish(job_id: int) -> None:
    """Put one job on the queue: a message of the job id and this instance's id."""
    process_job(job_id, get_context().instance_id)


def recover_once(
    hold: recovery.ReapHold | None = None, *, rounds: Sequence[recovery.Round] = ()
) -> recovery.RecoveryReport:
    """One recovery round over this instance's queue; ``rounds`` ride on it (the floors above's)."""
    return recovery.run_once(
        get_context(),
        publish=publish,
        queued_job_ids=queued_job_ids,
        window=dispatch_window(),
        hold=hold,
        rounds=rounds,
    )
