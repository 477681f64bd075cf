"""Rename and delete a dataset: the one place the console, the CLI and the API's manage scope do it.

Rename changes the dataset's row only: its Chroma collection's name is stored on the row and stays,
jobs and documents name the dataset by id, and so do API keys, so search, running jobs and scoped
keys go on working under the new name.

Delete goes in steps, each safe to repeat, so a delete that dies halfway is finished by running it
again, by ``sluice recover`` (``finish_deletions``) or by the workers' periodic recovery (steps 2
to 5 are sluice.pipeline.running.dataset_deletion, which the recovery round calls):

1. mark the dataset ``deleting_at``: from then on it takes no upload (``ensure_dataset`` refuses
   it), answers no search and is left out of every list one picks a dataset from;
2. cancel its waiting and running jobs by the cancel path (a running job's worker stops at its next
   batch); the delete waits a bounded time for them, and else stops here, to be run again;
3. delete its documents (every job deleted, then the blobs no other live document uses);
4. drop its Chroma collection and what is left of its lexical rows;
5. remove its rows (jobs and their events, documents, pauses, switched-off chunks, ...) and the
   dataset's row, in one transaction, and take its id out of every API key's datasets.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass

from sqlalchemy import func
from sqlmodel import Session, col, select

from sluice import faults
from sluice.ops import audit_trail
from sluice.ops.access import Operator, ReadOnlyOperator, require_operator
from sluice.ops.ingest import DATASET_NAME, DATASET_NAME_RULE
from sluice.pipeline.running import dataset_deletion
from sluice.pipeline.running.context import Context
from sluice.pipeline.running.dataset_deletion import WAITING
from sluice.storage.clock import db_now
from sluice.storage.models import Dataset, Document, Job, JobStatus

log = logging.getLogger(__name__)


@dataclass
class AdminResult:
    ok: bool
    message: str
    # unknown_dataset, invalid_dataset_name, dataset_name_taken, read_only, jobs_still_running
    code: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class DeletePlan:
    """What a delete of the dataset removes (shown before one confirms it)."""

    name: str
    documents: int
    chunks: int
    jobs_running: int
    jobs_waiting: int
    deleting: bool  # a delete already began

    def describe(self) -> str:
        text_ = (
            f"dataset {self.name!r}: {self.documents} document(s) and {self.chunks} chunk(s) "
            "will be removed, with every job's history"
        )
        if self.jobs_running or self.jobs_waiting:
            text_ += (
                f"; {self.jobs_running} running and {self.jobs_waiting} waiting job(s) will be "
                "cancelled"
            )
        return text_

    def to_dict(self) -> dict:
        return asdict(self)


def _dataset(session: Session, name: str) -> Dataset | None:
    return session.exec(select(Dataset).where(Dataset.name == name)).first()


def _unknown(name: str) -> AdminResult:
    return AdminResult(False, f"no dataset named {name!r}", "unknown_dataset")


def _refused(who: Operator, action: str) -> AdminResult | None:
    try:
        require_operator(who, action)
    except ReadOnlyOperator as exc:
        return AdminResult(False, str(exc), "read_only")
    return None


def name_unusable(new: str) -> str:
    """A rename's refusal for a name another dataset has, in words that do not say so: the answer
    of a key that does not reach that dataset is the same as of one that does (docs/api.md,
    Keys). The code stays ``dataset_name_taken``."""
    return f"the name {new!r} cannot be used: choose another"


def rename(
    ctx: Context, who: Operator, old: str, new: str, *, discreet: bool = False
) -> AdminResult:
    """Give the dataset ``old`` the name ``new`` (a change of its row only); audited.
    ``discreet``: a clash with another dataset's name is told without naming that dataset (an API
    key's answer; the console's and the CLI's operators see every dataset)."""
    with audit_trail.recording(  # its one commit is the rename
        who,
        "dataset.rename",
        target_kind="dataset",
        target_id=old,
        dataset=old,
        params={"name": new},
        check=lambda session: True,
    ) as rec:
        result = _rename(ctx, who, old, new)
    rec.settle(result.ok, result.message, code=result.code or None)  # the log sees every dataset
    if discreet and result.code == "dataset_name_taken":
        return AdminResult(False, name_unusable(new.strip()), result.code)
    return result


def _rename(ctx: Context, who: Operator, old: str, new: str) -> AdminResult:
    refused = _refused(who, "rename datasets")
    if refused is not None:
        return refused
    new = new.strip()
    if not DATASET_NAME.match(new):
        return AdminResult(
            False, f"{new!r} is not a dataset name: {DATASET_NAME_RULE}", "invalid_dataset_name"
        )
    with Session(ctx.engine) as session:
        ds = _dataset(session, old)
        if ds is None:
            return _unknown(old)
        if ds.deleting_at is not None:
            return AdminResult(False, f"dataset {old!r} is being deleted", "dataset_deleting")
        if new == old:
            return AdminResult(True, f"dataset {old!r} already has that name")
        if _dataset(session, new) is not None:
            return AdminResult(False, f"a dataset named {new!r} exists", "dataset_name_taken")
        ds.name = new
        session.add(ds)
        try:
            session.commit()
        except Exception:  # the unique name: made by another at the same moment
            session.rollback()
            if _dataset(session, new) is not None:
                return AdminResult(False, f"a dataset named {new!r} exists", "dataset_name_taken")
            raise
    log.info("dataset %r renamed to %r by %s", old, new, who.actor)
    return AdminResult(True, f"dataset {old!r} is now called {new!r}")


def plan_delete(ctx: Context, name: str) -> DeletePlan | None:
    """What deleting ``name`` would remove, or None when there is no such dataset."""
    with Session(ctx.engine) as session:
        ds = _dataset(session, name)
        if ds is None:
            return None
        documents = session.exec(
            select(func.count())
            .select_from(Document)
            .where(Document.dataset_id == ds.id, col(Document.deleted_at).is_(None))
        ).one()
        statuses = dict(
            session.exec(
                select(Job.status, func.count())
                .where(Job.dataset_id == ds.id, col(Job.status).in_([*WAITING, JobStatus.running]))
                .group_by(Job.status)
            ).all()
        )
        deleting = ds.deleting_at is not None
    try:
        chunks = ctx.vectors.count(ds.collection)
    except Exception:  # Chroma does not answer: the plan says what the job database knows
        chunks = 0
    return DeletePlan(
        name,
        documents,
        chunks,
        statuses.get(JobStatus.running, 0),
        sum(statuses.get(s, 0) for s in WAITING),
        deleting,
    )


def delete(ctx: Context, who: Operator, name: str, *, wait: float = 30.0) -> AdminResult:
    """Delete the dataset ``name`` and everything in it (see the module's steps). Running jobs are
    waited for up to ``wait`` seconds; when they have not stopped by then the dataset stays marked
    and the delete is to be run again (recovery does it too). Audited with the first commit: the
    mark."""
    with audit_trail.recording(
        who,
        "dataset.delete",
        target_kind="dataset",
        target_id=name,
        dataset=name,
        check=lambda session: True,
    ) as rec:
        result = _delete(ctx, who, name, wait=wait)
    rec.settle(result.ok, result.message, code=result.code or None)
    return result


def _delete(ctx: Context, who: Operator, name: str, *, wait: float) -> AdminResult:
    refused = _refused(who, "delete datasets")
    if refused is not None:
        return refused
    with Session(ctx.engine) as session:
        ds = _dataset(session, name)
        if ds is None:
            return _unknown(name)
        if ds.deleting_at is None:
            ds.deleting_at = db_now(session)
            session.add(ds)
            session.commit()
        dataset_id = ds.id
    faults.hit("dataset_delete_marked", dataset_id=dataset_id)
    return finish(ctx, dataset_id, actor=who.actor, wait=wait)


def finish(ctx: Context, dataset_id: int, *, actor: str, wait: float = 30.0) -> AdminResult:
    """Steps 2 to 5 of the delete of a dataset marked ``deleting_at``; safe to repeat."""
    done = dataset_deletion.finish(ctx, dataset_id, actor=actor, wait=wait)
    return AdminResult(done.ok, done.message, done.code)


def finish_deletions(ctx: Context, *, actor: str = "system:recovery") -> list[AdminResult]:
    """Finish every delete that began and did not end (a process died halfway), at once: what
    ``sluice recover`` does; the workers' recovery rounds finish those marked a while ago."""
    return [
        finish(ctx, dataset_id, actor=actor, wait=0) for dataset_id in dataset_deletion.marked(ctx)
    ]
