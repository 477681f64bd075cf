"""What an operator can do from the console, each a thin wrapper over sluice.storage.jobs or sluice.ops.ingest.

Every function takes the signed-in ``Operator`` and refuses a read-only one before touching anything.
Transitions that queue work write an outbox row in their own transaction; afterwards the outbox is
dispatched once here. When the queue Redis is down that dispatch fails quietly and the worker's
recovery loop publishes the rows when the queue is back, so an action never fails for that reason.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import BinaryIO

from sqlmodel import Session

from sluice.ops.access import Operator, ReadOnlyOperator, require_operator
from sluice.ops.ingest import IngestResult, ingest_stream
from sluice.ops.reads import ctx
from sluice.storage import jobs
from sluice.storage.db import ensure_dataset
from sluice.storage.jobs import ActionResult
from sluice.storage.outbox import dispatch

DATASET_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 _.-]{0,63}$")


@dataclass
class Outcome:
    """What the page shows after an action: one line per job, and whether the queue took them."""

    results: list[ActionResult]
    queue_note: str = ""

    @property
    def ok(self) -> int:
        return sum(r.ok for r in self.results)

    @property
    def refused(self) -> list[ActionResult]:
        return [r for r in self.results if not r.ok]


def _publish() -> Callable[[int], None]:
    from sluice.pipeline.queue import publish

    return publish


def dispatch_outbox() -> str:
    """Publish queued outbox rows now; returns a note for the page when the queue is unreachable."""
    try:
        sent = dispatch(engine=ctx().engine, publish=_publish())
    except Exception as exc:
        return f"queue unreachable ({type(exc).__name__}); the worker publishes these jobs when it is back"
    if sent.error:
        return f"queue unreachable ({sent.error}); the worker publishes these jobs when it is back"
    return ""


def _refuse_all(ids: Iterable[int], exc: ReadOnlyOperator) -> Outcome:
    return Outcome([ActionResult(i, False, str(exc)) for i in ids])


def _transition(fn, who: Operator, verb: str, ids: Iterable[int], *, queues_work: bool, **kw) -> Outcome:
    ids = [int(i) for i in ids]
    try:
        require_operator(who, verb)
    except ReadOnlyOperator as exc:
        return _refuse_all(ids, exc)
    with Session(ctx().engine) as session:
        results = fn(session=session, job_ids=ids, actor=who.actor, **kw)
    note = dispatch_outbox() if queues_work and any(r.ok for r in results) else ""
    return Outcome(results, note)


def retry(who: Operator, ids: Iterable[int], reason: str = "manual retry from the console") -> Outcome:
    return _transition(jobs.retry, who, "retry jobs", ids, queues_work=True, reason=reason)


def cancel(who: Operator, ids: Iterable[int]) -> Outcome:
    return _transition(jobs.request_cancel, who, "cancel jobs", ids, queues_work=False)


def reindex(who: Operator, ids: Iterable[int], reason: str = "reindex from the console") -> Outcome:
    return _transition(jobs.reindex, who, "reindex jobs", ids, queues_work=True, reason=reason)


def dismiss(who: Operator, ids: Iterable[int]) -> Outcome:
    return _transition(jobs.dismiss, who, "dismiss dead letters", ids, queues_work=False)


def upload(who: Operator, *, dataset: str, filename: str, stream: BinaryIO) -> IngestResult:
    try:
        require_operator(who, "upload files")
    except ReadOnlyOperator as exc:
        return IngestResult(filename, False, dataset=dataset, error_code="read_only", message=str(exc),
                            fix_hint="Sign in with the operator password to upload.")
    try:
        publish = _publish()
    except Exception:  # the queue module could not load its settings: upload, publish later
        publish = None
    return ingest_stream(ctx(), dataset=dataset, filename=filename, stream=stream, actor=who.actor,
                         publish=publish)


def create_dataset(who: Operator, name: str) -> tuple[bool, str]:
    try:
        require_operator(who, "create datasets")
    except ReadOnlyOperator as exc:
        return False, str(exc)
    name = name.strip()
    if not DATASET_NAME.match(name):
        return False, ("A dataset name is 1 to 64 letters, digits, spaces, '.', '_' or '-', "
                       "starting with a letter or digit.")
    with Session(ctx().engine) as session:
        ensure_dataset(session=session, name=name)
    return True, f"dataset {name!r} is ready"
