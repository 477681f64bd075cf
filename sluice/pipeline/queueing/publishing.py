"""Putting jobs on the queue from anywhere: a front end, a bench, a test.

The task that runs a job lives in ``tasks``, which imports ``broker``; publishing needs that task,
so it lives here, above both, and ``broker`` stays free of the task (the queue glue has no cycle).
Imported lazily: a page that never publishes never builds the Huey instance.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy.engine import Engine

from sluice.pipeline.queueing import broker
from sluice.storage.outbox import DispatchResult


def publish(job_id: int) -> None:
    """Put one job on the queue (raises when the queue Redis is unreachable).

    The message is plain data: the job id and the id of the job database it belongs to.
    """
    from sluice.pipeline.queueing.tasks import publish as publish_job  # the task registers itself

    publish_job(job_id)


def dispatch_now(
    engine: Engine, *, via: Callable[[int], None] | None = None
) -> tuple[DispatchResult, str]:
    """Publish due outbox rows now (through ``via``, the queue by default); what was sent and the
    operator's note (empty when everything went)."""
    return broker.dispatch_now(engine, via=via or publish)
