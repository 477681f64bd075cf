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
from typing import Any, BinaryIO

from sqlmodel import Session, select

from sluice.ops import audit_trail, chunks, document_switch, documents, settings_changes
from sluice.ops import metadata as meta
from sluice.ops import reindex as reindexing
from sluice.ops.access import Operator, ReadOnlyOperator, require_operator
from sluice.ops.blob_migration import MigrationResult, migrate_to_s3
from sluice.ops.ingest import IngestResult, ingest_stream
from sluice.ops.reads import bulk_preview, ctx, document_ids, job_rows
from sluice.ops.unlock import LOCKED_CODES, unlock_and_retry  # noqa: F401  (LOCKED_CODES: for the console)
from sluice.pipeline.queueing.publishing import dispatch_now, publish
from sluice.pipeline.reconcile import audit
from sluice.pipeline.reconcile.report import ReconcileReport
from sluice.pipeline.running.cleanup import remove_partial
from sluice.storage import jobs, retention
from sluice.storage.db import ensure_dataset
from sluice.storage.jobs import ActionResult
from sluice.storage.models import Dataset, Document, ErrorKind, Job, JobStatus, utcnow
from sluice.storage.queries import JobFilter

DATASET_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 _.-]{0,63}$")
# The audit log's name of each job action, and the job events that mark its change.
RETRY = ("job.retry", frozenset({"retried"}))
CANCEL = ("job.cancel", frozenset({"cancel_requested", "cancelled"}))
REINDEX = ("job.reindex", frozenset({"reindex_requested"}))
DISMISS = ("job.dismiss", frozenset({"dismissed"}))
PRIORITY = ("job.priority", frozenset({"priority"}))
UPLOADED = frozenset({"created", "reuploaded", "retried"})
REINDEXED = frozenset({"created", "reindex_requested", "retried", "revived"})


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
    audit_as: tuple[str, frozenset[str]] = ("", frozenset()),
    **kw,
) -> ActionReport:
    ids = [int(i) for i in ids]
    action, kinds = audit_as
    params = {k: v for k, v in kw.items() if k in ("reason", "priority")}
    try:
        require_operator(who, verb)
    except ReadOnlyOperator as exc:
        for i in ids:
            audit_trail.refused(
                who, action, str(exc), target_kind="job", target_id=i, params=params
            )
        return _refused(ids, exc)
    with audit_trail.recording(
        who, action, target_kind="job", kinds=kinds, per_job=True, params=params
    ) as rec:
        with Session(ctx().engine) as session:
            results = fn(session=session, job_ids=ids, actor=who.actor, **kw)
    rec.settle_jobs(results)
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
    report = _transition(
        jobs.retry, who, "retry jobs", ids, queues_work=True, reason=reason, audit_as=RETRY
    )
    report.warnings = [o for o in outlooks if o]
    return report


def retry_with_password(who: Operator, job_id: int, password: str) -> ActionReport:
    """A password-protected PDF's job: decrypt it with ``password`` and queue it again
    (sluice.ops.unlock)."""
    try:
        require_operator(who, "unlock files")
    except ReadOnlyOperator as exc:
        audit_trail.refused(who, "job.unlock", str(exc), target_kind="job", target_id=job_id)
        return _refused([job_id], exc)
    with audit_trail.recording(  # never the password: only that one was given
        who, "job.unlock", target_kind="job", target_id=job_id, kinds=frozenset({"retried"})
    ) as rec:
        result = unlock_and_retry(ctx(), int(job_id), password, actor=who.actor)
    rec.settle(result.ok, result.message)
    return ActionReport([result], dispatch_outbox() if result.ok else "")


def cancel(who: Operator, ids: Iterable[int]) -> ActionReport:
    """Cancel jobs. A running one stops at its next batch and its worker removes what it wrote; one
    waiting (pending, or retrying after a failed attempt that wrote chunks) is cancelled here, so
    what an earlier attempt wrote is removed here too."""
    report = _transition(
        jobs.request_cancel, who, "cancel jobs", ids, queues_work=False, audit_as=CANCEL
    )
    with Session(ctx().engine, expire_on_commit=False) as session:
        ended = [session.get(Job, r.job_id) for r in report.results if r.ok]
    for job in ended:
        if job is not None and job.status == JobStatus.cancelled:
            remove_partial(ctx(), job)
    return report


def reindex(who: Operator, ids: Iterable[int], reason: str = "reindex") -> ActionReport:
    return _transition(
        jobs.reindex, who, "reindex jobs", ids, queues_work=True, reason=reason, audit_as=REINDEX
    )


def dismiss(who: Operator, ids: Iterable[int]) -> ActionReport:
    return _transition(
        jobs.dismiss, who, "dismiss dead letters", ids, queues_work=False, audit_as=DISMISS
    )


def run_next(who: Operator, ids: Iterable[int]) -> ActionReport:
    """Move waiting jobs to the front of what the dispatcher publishes next."""
    return _transition(
        jobs.run_next, who, "move jobs in the queue", ids, queues_work=True, audit_as=PRIORITY
    )


def set_priority(who: Operator, ids: Iterable[int], priority: int | None) -> ActionReport:
    return _transition(
        jobs.set_priority,
        who,
        "move jobs in the queue",
        ids,
        queues_work=True,
        priority=priority,
        audit_as=PRIORITY,
    )


def set_dataset_priority(who: Operator, dataset_id: int, priority: int | None) -> tuple[bool, str]:
    """The priority of the dataset's jobs that have none of their own (higher goes first; None:
    0)."""
    params = {"priority": priority}
    try:
        require_operator(who, "set dataset priorities")
    except ReadOnlyOperator as exc:
        audit_trail.refused(who, "dataset.priority", str(exc), target_id=dataset_id, params=params)
        return False, str(exc)
    exists = _dataset_exists(dataset_id)
    with audit_trail.recording(
        who,
        "dataset.priority",
        target_kind="dataset",
        target_id=dataset_id,
        params=params,
        check=exists,
    ) as rec:
        with Session(ctx().engine) as session:
            done = jobs.set_dataset_priority(
                session=session, dataset_id=dataset_id, priority=priority
            )
    rec.settle(done, "" if done else f"no dataset {dataset_id}")
    if not done:
        return False, f"no dataset {dataset_id}"
    return True, f"dataset priority set to {0 if priority is None else priority}"


def _upload_action(session: Session, job: Job) -> str:
    """A new version of a document under its external id is a replace; any other, an upload."""
    doc = session.get(Document, job.document_id)
    return "document.replace" if doc is not None and doc.replaces_document_id else "document.upload"


def _dataset_exists(dataset_id: int) -> Callable[[Session], bool]:
    return lambda session: session.get(Dataset, dataset_id) is not None


# --- uploads and datasets -------------------------------------------------------------------------


def upload(
    who: Operator,
    *,
    dataset: str,
    filename: str,
    stream: BinaryIO,
    external_id: str | None = None,
    metadata: dict | None = None,
    dataset_id: int | None = None,  # the dataset as the caller resolved it (sluice.ops.ingest)
    declared_type: str = "",  # the media type the client gave the file (sluice.ops.ingest)
    dispatch: Callable[[], object] | None = None,  # publishes the job instead (sluice.ops.ingest)
) -> IngestResult:
    params = {"filename": filename, **({"external_id": external_id} if external_id else {})}
    try:
        require_operator(who, "upload files")
    except ReadOnlyOperator as exc:
        audit_trail.refused(
            who,
            "document.upload",
            str(exc),
            target_kind="document",
            dataset=dataset,
            params=params,
            code="read_only",
        )
        return IngestResult(
            filename,
            False,
            dataset=dataset,
            error_code="read_only",
            message=str(exc),
            fix_hint="Sign in with the operator password to upload.",
        )
    with audit_trail.recording(
        who,
        "document.upload",
        target_kind="document",
        dataset=dataset,
        kinds=UPLOADED,
        params=params,
        refine=_upload_action,
    ) as rec:
        result = ingest_stream(
            ctx(),
            dataset=dataset,
            dataset_id=dataset_id,
            filename=filename,
            stream=stream,
            actor=who.actor,
            publish=publish,
            external_id=external_id,
            metadata=metadata,
            declared_type=declared_type,
            dispatch=dispatch,
        )
    rec.settle(
        result.accepted,
        result.message,
        code=result.error_code,
        target=result.document_id,
        params={**params, "job_id": result.job_id, "duplicate": result.duplicate},
    )
    return result


def upload_path(
    who: Operator,
    path: Path,
    *,
    dataset: str,
    external_id: str | None = None,
    metadata: dict | None = None,
    dataset_id: int | None = None,
) -> IngestResult:
    with open(path, "rb") as fh:
        return upload(
            who,
            dataset=dataset,
            filename=path.name,
            stream=fh,
            external_id=external_id,
            metadata=metadata,
            dataset_id=dataset_id,
        )


def set_document_metadata(who: Operator, document_id: int, value: Any) -> dict:
    """Replace a document's metadata (sluice.ops.metadata; MetadataError names a bad key)."""
    with audit_trail.recording(  # its first commit is the change of the document's row
        who,
        "document.metadata",
        target_kind="document",
        target_id=document_id,
        params={"metadata": value},
        check=lambda session: True,
    ) as rec:
        try:
            require_operator(who, "change document metadata")
            return meta.set_document_metadata(ctx(), document_id, value, actor=who.actor)
        except (ReadOnlyOperator, meta.MetadataError, meta.UnknownDocument) as exc:
            rec.settle(False, str(exc), code=type(exc).__name__)
            raise


def _switch(who: Operator, kind: str, target_id, enabled: bool, flip, refusals: tuple) -> Any:
    """An audited switch of a chunk or a document (``flip`` does it): one audit row, its action
    ``{kind}.enable`` or ``{kind}.disable``, settled as refused on any of ``refusals``."""
    with audit_trail.recording(  # the switch's first commit is the change
        who,
        f"{kind}.enable" if enabled else f"{kind}.disable",
        target_kind=kind,
        target_id=target_id,
        check=lambda session: True,
    ) as rec:
        try:
            require_operator(who, f"switch {kind}s on or off")
            return flip()
        except (ReadOnlyOperator, *refusals) as exc:
            rec.settle(False, str(exc), code=type(exc).__name__)
            raise


def set_chunk_enabled(
    who: Operator, chunk_id: str, enabled: bool, *, dataset_ids: list[int] | None = None
) -> chunks.ChunkState:
    """Switch a chunk on or off (sluice.ops.chunks)."""
    return _switch(
        who,
        "chunk",
        chunk_id,
        enabled,
        lambda: chunks.set_chunk_enabled(
            ctx(), chunk_id, enabled, actor=who.actor, dataset_ids=dataset_ids
        ),
        (chunks.UnknownChunk, chunks.AmbiguousChunk),
    )


def edit_chunk(
    who: Operator, chunk_id: str, text: str, *, dataset_ids: list[int] | None = None
) -> chunks.ChunkState:
    """Give a chunk new text, embedded again (sluice.ops.chunks); audited as ``chunk.edit``, its
    text's length recorded, never the text."""
    with audit_trail.recording(  # the edit's first commit is the change
        who,
        "chunk.edit",
        target_kind="chunk",
        target_id=chunk_id,
        params={"characters": len(text) if isinstance(text, str) else None},
        check=lambda session: True,
    ) as rec:
        try:
            require_operator(who, "edit chunks")
            return chunks.edit_chunk(
                ctx(), chunk_id, text, actor=who.actor, dataset_ids=dataset_ids
            )
        except (
            ReadOnlyOperator,
            chunks.UnknownChunk,
            chunks.AmbiguousChunk,
            chunks.BadChunkText,
            chunks.EditConflict,
        ) as exc:
            rec.settle(False, str(exc), code=type(exc).__name__)
            raise


def set_document_enabled(
    who: Operator, document_id: int, enabled: bool, *, dataset_ids: list[int] | None = None
) -> document_switch.DocumentState:
    """Switch a whole document on or off (sluice.ops.document_switch)."""
    return _switch(
        who,
        "document",
        document_id,
        enabled,
        lambda: document_switch.set_document_enabled(
            ctx(), document_id, enabled, actor=who.actor, dataset_ids=dataset_ids
        ),
        (meta.UnknownDocument,),
    )


def create_dataset(who: Operator, name: str) -> tuple[bool, str]:
    try:
        require_operator(who, "create datasets")
    except ReadOnlyOperator as exc:
        audit_trail.refused(who, "dataset.create", str(exc), target_kind="dataset", target_id=name)
        return False, str(exc)
    name = name.strip()
    if not DATASET_NAME.match(name):
        return False, (
            "A dataset name is 1 to 64 letters, digits, spaces, '.', '_' or '-', "
            "starting with a letter or digit."
        )
    with audit_trail.recording(
        who, "dataset.create", target_kind="dataset", target_id=name, dataset=name, model=Dataset
    ):  # an existing dataset is no change: no row
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
    params = {"settings": assignments}
    try:
        require_operator(who, "change dataset settings")
    except ReadOnlyOperator as exc:
        audit_trail.refused(
            who,
            "dataset.settings",
            str(exc),
            target_kind="dataset",
            target_id=name,
            dataset=name,
            params=params,
        )
        return settings_changes.SettingsChange(False, str(exc), dataset=name)
    with audit_trail.recording(
        who,
        "dataset.settings",
        target_kind="dataset",
        target_id=name,
        dataset=name,
        params=params,
        check=_settings_saved(name, who.actor),
    ) as rec:
        change = settings_changes.apply(ctx(), name, assignments, actor=who.actor, publish=publish)
    rec.settle(change.ok, change.message)
    return change


def _settings_saved(name: str, actor: str) -> Callable[[Session], bool]:
    """True before the commit that saved the dataset's settings (a change of its last change)."""
    with Session(ctx().engine) as session:
        ds = session.exec(select(Dataset).where(Dataset.name == name)).first()
        before = ds.settings_changed_at if ds is not None else None

    def saved(session: Session) -> bool:
        row = session.exec(select(Dataset).where(Dataset.name == name)).first()
        return (
            row is not None
            and row.settings_changed_at != before
            and (row.settings_changed_by == actor)
        )

    return saved


# --- integrity: delete, reconcile, reindex to the version in force --------------------------------


def delete_document(who: Operator, ref: str | int) -> documents.DeleteResult:
    try:
        require_operator(who, "delete documents")
    except ReadOnlyOperator as exc:
        audit_trail.refused(
            who, "document.delete", str(exc), target_kind="document", target_id=str(ref)
        )
        return documents.DeleteResult(False, str(exc))
    return _delete(who, ref, "document deleted")


def _delete(who: Operator, ref: str | int, reason: str) -> documents.DeleteResult:
    with audit_trail.recording(
        who,
        "document.delete",
        target_kind="document",
        kinds=frozenset({"deleted"}),
        params={"reference": str(ref), "reason": reason},
    ) as rec:
        done = documents.delete_document(ctx(), ref, actor=who.actor, reason=reason)
    doc = done.document
    rec.settle(
        done.ok,
        done.message,
        target=doc.document_id if doc else str(ref),
        dataset=doc.dataset if doc else None,
    )
    return done


def reconcile(
    who: Operator, *, repair: bool, dataset: str | None = None, changed_only: bool = False
) -> ReconcileReport:
    """Audit the index (anyone may look); repair it (operators only). ``changed_only``: only the
    jobs that changed since the last repairing pass (``reconcile --changed``)."""
    if repair:
        try:
            require_operator(who, "repair the index")
        except ReadOnlyOperator as exc:
            report = ReconcileReport(
                repair=False, actor=who.actor, started_at=utcnow().isoformat(), scope=dataset
            )
            report.errors.append(str(exc))
            return report
    return audit.reconcile(
        ctx(),
        repair=repair,
        actor=who.actor,
        dataset=dataset,
        publish=publish,
        changed_only=changed_only,
    )


def migrate_blobs(who: Operator, *, keep_local: bool = False) -> MigrationResult:
    """Move the local blob store into the object store (operators only); resumable."""
    return migrate_to_s3(ctx(), who, keep_local=keep_local)


def reindex_all(who: Operator, *, dataset: str | None = None) -> reindexing.ReindexResult:
    target = dataset or "*"
    try:
        require_operator(who, "reindex documents")
    except ReadOnlyOperator as exc:
        audit_trail.refused(
            who,
            "dataset.reindex",
            str(exc),
            target_kind="dataset",
            target_id=target,
            dataset=dataset,
        )
        result = reindexing.ReindexResult(ctx().pipeline_version)
        result.results.append(ActionResult(0, False, str(exc)))
        return result
    with audit_trail.recording(
        who,
        "dataset.reindex",
        target_kind="dataset",
        target_id=target,
        dataset=dataset,
        kinds=REINDEXED,
    ) as rec:
        result = reindexing.reindex_all(ctx(), actor=who.actor, dataset=dataset, publish=publish)
    rec.settle(True, f"{result.queued} queued, {result.underway} under way")
    return result


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
        done = _delete(who, f"doc:{doc_id}", why)
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
