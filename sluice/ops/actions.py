"""Everything an operator can change, once, for both front ends (the console and the ``sluice``
command).

Every function takes the acting ``Operator`` and refuses a read-only one before touching anything
(one check: ``sluice.ops.access.require_operator``); the operator's ``actor`` names them in every
job event. Transitions that queue work write an outbox row in their own transaction and the action
then publishes the outbox once; when the queue is unreachable the action still succeeds and says so
in the words of ``sluice.pipeline.queueing.broker.queue_note``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import BinaryIO

from sqlmodel import Session

from sluice.ops import documents, settings_changes
from sluice.ops import reindex as reindexing
from sluice.ops.access import Operator, ReadOnlyOperator, require_operator
from sluice.ops.blob_migration import MigrationResult, migrate_to_s3
from sluice.ops.ingest import IngestResult, ingest_stream
from sluice.ops.reads import bulk_preview, ctx, dead_letter_ids, document_ids, job_rows
from sluice.ops.unlock import LOCKED_CODES, unlock_and_retry  # noqa: F401  (LOCKED_CODES: for the console)
from sluice.pipeline.queueing.publishing import dispatch_now, publish
from sluice.pipeline.reconcile import audit
from sluice.pipeline.reconcile.report import ReconcileReport
from sluice.pipeline.running.cleanup import remove_partial
from sluice.storage import jobs, retention
from sluice.storage.db import ensure_dataset
from sluice.storage.jobs import ActionResult
from sluice.storage.models import ErrorKind, Job, JobStatus, utcnow
from sluice.storage.queries import JobFilter

DATASET_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 _.-]{0,63}$")


@dataclass
class ActionReport:
    """What one action did: a line per job, and a note when the queue did not take the work now."""

    results: list[ActionResult]
    queue_note: str = ""
    warnings: list[str] = field(default_factory=list)  # what the operator should know before hoping

    @property
    def ok(self) -> int:
        return sum(r.ok for r in self.results)

    @property
    def refused(self) -> list[ActionResult]:
        return [r for r in self.results if not r.ok]

    @property
    def all_ok(self) -> bool:
        return bool(self.results) and not self.refused


def dispatch_outbox() -> str:
    """Publish queued outbox rows now; returns the operator's note when the queue did not take
    them."""
    return dispatch_now(ctx().engine)[1]


def _refused(ids: Iterable[int], exc: ReadOnlyOperator) -> ActionReport:
    return ActionReport(
        [ActionResult(i, False, str(exc)) for i in ids] or [ActionResult(0, False, str(exc))]
    )


def _transition(
    fn: Callable[..., list[ActionResult]],
    who: Operator,
    verb: str,
    ids: Iterable[int],
    *,
    queues_work: bool,
    **kw,
) -> ActionReport:
    ids = [int(i) for i in ids]
    try:
        require_operator(who, verb)
    except ReadOnlyOperator as exc:
        return _refused(ids, exc)
    with Session(ctx().engine) as session:
        results = fn(session=session, job_ids=ids, actor=who.actor, **kw)
    note = dispatch_outbox() if queues_work and any(r.ok for r in results) else ""
    return ActionReport(results, note)


# --- jobs -----------------------------------------------------------------------------------------


def retry_outlook(row: dict) -> str:
    """What a retry of this failed job will do, when that is not simply "run again": a permanent or
    user-action failure comes from the file, so the same bytes fail the same way."""
    if row["status"] != "failed" or row["error_kind"] not in (
        ErrorKind.permanent.value,
        ErrorKind.user_action_required.value,
    ):
        return ""
    # A sentence of its own: the front ends end it (". Retry anyway?"), so no full stop of ours.
    because = (row["error_message"] or "").rstrip(". ")
    helps = (row["fix_hint"] or "").rstrip(". ")
    return (
        f"job {row['id']} ({row['filename']}) failed because {because}; a retry runs the "
        "same file again and fails the same way unless that cause has been fixed outside the file"
        + (f". What helps: {helps}" if helps else "")
    )


def retry(who: Operator, ids: Iterable[int], reason: str = "manual retry") -> ActionReport:
    ids = [int(i) for i in ids]
    outlooks = [retry_outlook(r) for r in job_rows(ids)] if who.can_act else []
    report = _transition(jobs.retry, who, "retry jobs", ids, queues_work=True, reason=reason)
    report.warnings = [o for o in outlooks if o]
    return report


def retry_with_password(who: Operator, job_id: int, password: str) -> ActionReport:
    """A password-protected PDF's job: decrypt it with ``password`` and queue it again
    (sluice.ops.unlock)."""
    try:
        require_operator(who, "unlock files")
    except ReadOnlyOperator as exc:
        return _refused([job_id], exc)
    result = unlock_and_retry(ctx(), int(job_id), password, actor=who.actor)
    return ActionReport([result], dispatch_outbox() if result.ok else "")


def retry_dead(
    who: Operator,
    *,
    kind: str | None = None,
    code: str | None = None,
    dataset_id: int | None = None,
    reason: str = "manual retry",
) -> ActionReport:
    """Retry every dead letter of a kind (and reason), in one dataset or all."""
    return retry(who, dead_letter_ids(kind, code, dataset_id), reason=reason)


def cancel(who: Operator, ids: Iterable[int]) -> ActionReport:
    """Cancel jobs. A running one stops at its next batch and its worker removes what it wrote; one
    waiting (pending, or retrying after a failed attempt that wrote chunks) is cancelled here, so
    what an earlier attempt wrote is removed here too."""
    report = _transition(jobs.request_cancel, who, "cancel jobs", ids, queues_work=False)
    with Session(ctx().engine, expire_on_commit=False) as session:
        ended = [session.get(Job, r.job_id) for r in report.results if r.ok]
    for job in ended:
        if job is not None and job.status == JobStatus.cancelled:
            remove_partial(ctx(), job)
    return report


def reindex(who: Operator, ids: Iterable[int], reason: str = "reindex") -> ActionReport:
    return _transition(jobs.reindex, who, "reindex jobs", ids, queues_work=True, reason=reason)


def dismiss(who: Operator, ids: Iterable[int]) -> ActionReport:
    return _transition(jobs.dismiss, who, "dismiss dead letters", ids, queues_work=False)


def run_next(who: Operator, ids: Iterable[int]) -> ActionReport:
    """Move waiting jobs to the front of what the dispatcher publishes next."""
    return _transition(jobs.run_next, who, "move jobs in the queue", ids, queues_work=True)


def set_priority(who: Operator, ids: Iterable[int], priority: int | None) -> ActionReport:
    return _transition(
        jobs.set_priority, who, "move jobs in the queue", ids, queues_work=True, priority=priority
    )


def set_dataset_priority(who: Operator, dataset_id: int, priority: int | None) -> tuple[bool, str]:
    """The priority of the dataset's jobs that have none of their own (higher goes first; None:
    0)."""
    try:
        require_operator(who, "set dataset priorities")
    except ReadOnlyOperator as exc:
        return False, str(exc)
    with Session(ctx().engine) as session:
        if not jobs.set_dataset_priority(session=session, dataset_id=dataset_id, priority=priority):
            return False, f"no dataset {dataset_id}"
    return True, f"dataset priority set to {0 if priority is None else priority}"


# --- uploads and datasets -------------------------------------------------------------------------


def upload(
    who: Operator,
    *,
    dataset: str,
    filename: str,
    stream: BinaryIO,
    external_id: str | None = None,
) -> IngestResult:
    try:
        require_operator(who, "upload files")
    except ReadOnlyOperator as exc:
        return IngestResult(
            filename,
            False,
            dataset=dataset,
            error_code="read_only",
            message=str(exc),
            fix_hint="Sign in with the operator password to upload.",
        )
    return ingest_stream(
        ctx(),
        dataset=dataset,
        filename=filename,
        stream=stream,
        actor=who.actor,
        publish=publish,
        external_id=external_id,
    )


def upload_path(
    who: Operator, path: Path, *, dataset: str, external_id: str | None = None
) -> IngestResult:
    with open(path, "rb") as fh:
        return upload(who, dataset=dataset, filename=path.name, stream=fh, external_id=external_id)


def create_dataset(who: Operator, name: str) -> tuple[bool, str]:
    try:
        require_operator(who, "create datasets")
    except ReadOnlyOperator as exc:
        return False, str(exc)
    name = name.strip()
    if not DATASET_NAME.match(name):
        return False, (
            "A dataset name is 1 to 64 letters, digits, spaces, '.', '_' or '-', "
            "starting with a letter or digit."
        )
    with Session(ctx().engine) as session:
        ensure_dataset(session=session, name=name)
    return True, f"dataset {name!r} is ready"


def dataset_settings(name: str) -> settings_changes.SettingsView:
    """What the dataset parses with now (anyone may look)."""
    return settings_changes.current(ctx(), name)


def preview_dataset_settings(
    name: str, assignments: dict[str, str | None]
) -> settings_changes.SettingsChange:
    """What a change of the dataset's parse settings would cost, before anything is written."""
    return settings_changes.propose(ctx(), name, assignments)


def set_dataset_settings(
    who: Operator, name: str, assignments: dict[str, str | None]
) -> settings_changes.SettingsChange:
    """Save the dataset's parse settings (KEY -> value; None unsets) and rebuild that dataset with
    them."""
    try:
        require_operator(who, "change dataset settings")
    except ReadOnlyOperator as exc:
        return settings_changes.SettingsChange(False, str(exc), dataset=name)
    return settings_changes.apply(ctx(), name, assignments, actor=who.actor, publish=publish)


# --- integrity: delete, reconcile, reindex to the version in force --------------------------------


def delete_document(who: Operator, ref: str | int) -> documents.DeleteResult:
    try:
        require_operator(who, "delete documents")
    except ReadOnlyOperator as exc:
        return documents.DeleteResult(False, str(exc))
    return documents.delete_document(ctx(), ref, actor=who.actor)


def reconcile(who: Operator, *, repair: bool, dataset: str | None = None) -> ReconcileReport:
    """Audit the index (anyone may look); repair it (operators only)."""
    if repair:
        try:
            require_operator(who, "repair the index")
        except ReadOnlyOperator as exc:
            report = ReconcileReport(
                repair=False, actor=who.actor, started_at=utcnow().isoformat(), scope=dataset
            )
            report.errors.append(str(exc))
            return report
    return audit.reconcile(ctx(), repair=repair, actor=who.actor, dataset=dataset, publish=publish)


def migrate_blobs(who: Operator, *, keep_local: bool = False) -> MigrationResult:
    """Move the local blob store into the object store (operators only); resumable."""
    return migrate_to_s3(ctx(), who, keep_local=keep_local)


def reindex_all(who: Operator, *, dataset: str | None = None) -> reindexing.ReindexResult:
    try:
        require_operator(who, "reindex documents")
    except ReadOnlyOperator as exc:
        result = reindexing.ReindexResult(ctx().pipeline_version)
        result.results.append(ActionResult(0, False, str(exc)))
        return result
    return reindexing.reindex_all(ctx(), actor=who.actor, dataset=dataset, publish=publish)


# --- bulk: every job a filter matches -------------------------------------------------------------


def bulk(who: Operator, action: str, f: JobFilter, *, reason: str = "") -> ActionReport:
    """Retry, cancel, reindex or delete every job ``f`` matches that the action applies to; each job
    gets its own audit event, as if acted on alone."""
    preview = bulk_preview(action, f, with_cost=False)
    why = reason or f"bulk {action} by filter"
    if action == "retry":
        return retry(who, preview.job_ids, reason=why)
    if action == "cancel":
        return cancel(who, preview.job_ids)
    if action == "reindex":
        return reindex(who, preview.job_ids, reason=why)
    if action != "delete":
        raise ValueError(f"unknown bulk action {action!r}")
    try:
        require_operator(who, "delete documents")
    except ReadOnlyOperator as exc:
        return _refused(preview.job_ids, exc)
    results = []
    for doc_id, job_id in document_ids(preview.job_ids).items():
        done = documents.delete_document(ctx(), f"doc:{doc_id}", actor=who.actor, reason=why)
        results.append(ActionResult(job_id, done.ok, done.message))
    return ActionReport(results)


# --- retention ------------------------------------------------------------------------------------


def prune(who: Operator, *, dry_run: bool, days: int | None = None) -> retention.PruneReport:
    """Forget what retention allows (see sluice.storage.retention); a dry run only counts."""
    days = ctx().settings.retention_days if days is None else days
    cutoff = utcnow() - timedelta(days=days)
    if not dry_run:
        require_operator(who, "prune the job history")
    with Session(ctx().engine) as session:
        return retention.prune(session=session, cutoff=cutoff, dry_run=dry_run)
