"""A dataset's own parse settings: show them, preview a change, apply it.

A change gives the dataset's documents a new pipeline version (their chunks are cut or read
differently), so applying it is the versioned reindex of that dataset and nothing else: each
document keeps serving its current chunks until its job of the new version succeeds. Jobs of the
old version that have not started (or failed) build the new one instead; a job running now finishes
on the old version and its document shows up as still to rebuild (`sluice reindex --all --dataset`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import update
from sqlmodel import Session, col

from sluice import faults
from sluice.errors import SettingsError
from sluice.ops import reindex as reindexing
from sluice.ops.search import UnknownDataset, dataset_named
from sluice.pipeline.parsing import ocr
from sluice.pipeline.queueing.broker import queue_note
from sluice.pipeline.running.context import Context
from sluice.storage import dataset_settings, jobs, lexical
from sluice.storage.clock import db_now
from sluice.storage.db import matched
from sluice.storage.models import Dataset

log = logging.getLogger(__name__)


@dataclass
class SettingRow:
    key: str
    value: int | str  # the chunk sizes are numbers, the OCR settings words
    source: str  # "dataset" (set here) or "default" (the process's SLUICE_* setting)
    description: str

    def to_dict(self) -> dict:
        return {
            "key": self.key,
            "value": self.value,
            "source": self.source,
            "description": self.description,
        }


@dataclass
class SettingsView:
    dataset: str
    rows: list[SettingRow]
    pipeline_version: str
    changed_at: datetime | None
    changed_by: str | None
    to_rebuild: (
        int  # documents whose searchable chunks are of another version (a reindex under way or due)
    )

    @property
    def overrides(self) -> dict:
        return {r.key: r.value for r in self.rows if r.source == "dataset"}

    def to_dict(self) -> dict:
        return {
            "dataset": self.dataset,
            "settings": [r.to_dict() for r in self.rows],
            "pipeline_version": self.pipeline_version,
            "changed_at": self.changed_at.isoformat() if self.changed_at else None,
            "changed_by": self.changed_by,
            "documents_to_rebuild": self.to_rebuild,
        }


@dataclass
class SettingsChange:
    ok: bool
    message: str
    dataset: str = ""
    before: dict = field(default_factory=dict)
    after: dict = field(default_factory=dict)
    from_version: str = ""
    to_version: str = ""
    plan: reindexing.ReindexPlan | None = None
    applied: bool = False
    restamped: list[int] = field(default_factory=list)
    reindex: reindexing.ReindexResult | None = None
    read_at: datetime | None = None  # the dataset's last change when ``before`` was read

    def to_dict(self) -> dict:
        return {
            "ok": self.ok,
            "message": self.message,
            "dataset": self.dataset,
            "before": self.before,
            "after": self.after,
            "from_version": self.from_version,
            "to_version": self.to_version,
            "plan": self.plan.to_dict() if self.plan else None,
            "applied": self.applied,
            "restamped": self.restamped,
            "reindex": self.reindex.to_dict() if self.reindex else None,
        }


def current(ctx: Context, name: str) -> SettingsView:
    with Session(ctx.engine) as session:
        ds = dataset_named(session, name)
    eff = ctx.settings_for(ds)
    own = dataset_settings.overrides_of(ds.parse_settings)
    rows = [
        SettingRow(
            k,
            getattr(eff, k),
            "dataset" if k in own else "default",
            dataset_settings.DESCRIPTIONS[k],
        )
        for k in dataset_settings.KEYS
    ]
    behind = sum(c.action != "underway" for c in reindexing.candidates(ctx, dataset=name))
    return SettingsView(
        name, rows, ctx.version_for(ds), ds.settings_changed_at, ds.settings_changed_by, behind
    )


def propose(
    ctx: Context, name: str, assignments: dict[str, str | None], *, preview: bool = True
) -> SettingsChange:
    """What the change would be and cost (documents, chunks, cache), without writing anything."""
    try:
        with Session(ctx.engine) as session:
            ds = dataset_named(session, name)
        after = dataset_settings.change(ctx.settings, ds.parse_settings, assignments)
    except (UnknownDataset, SettingsError) as exc:
        return SettingsChange(False, str(exc), dataset=name)
    language = after.get("ocr_language")
    if language and language != dataset_settings.overrides_of(ds.parse_settings).get(
        "ocr_language"
    ):
        missing = ocr.available(language)
        if missing:
            return SettingsChange(False, f"ocr_language {language}: {missing}", dataset=name)
    proposed = Dataset.model_validate(ds.model_dump())
    proposed.parse_settings = after or None
    change = SettingsChange(
        True,
        "",
        dataset=name,
        before=dataset_settings.overrides_of(ds.parse_settings),
        after=after,
        from_version=ctx.version_for(ds),
        to_version=ctx.version_for(proposed),
        read_at=ds.settings_changed_at,
    )
    if change.from_version == change.to_version:
        change.message = (
            f"dataset {name!r} keeps pipeline {change.to_version}: these settings cut and read "
            "its documents as before, nothing to reindex"
        )
        return change
    if preview:
        change.plan = reindexing.plan(ctx, dataset=name, proposed=proposed)
        change.message = (
            f"dataset {name!r} moves to pipeline {change.to_version}: {change.plan.describe()}"
        )
    return change


def _save(session: Session, ds: Dataset, change: SettingsChange, actor: str) -> bool:
    """Write the new settings by compare-and-set on the dataset's last change: a change another
    operator applied since ``change`` was computed from the settings before it is not overwritten
    (its setting lost, its jobs restamped to a version that is then no one's)."""
    read = change.read_at
    saved = matched(
        session,
        update(Dataset)
        .where(
            col(Dataset.id) == ds.id,
            col(Dataset.settings_changed_at).is_(None)
            if read is None
            else col(Dataset.settings_changed_at) == read,
        )
        .values(
            parse_settings=change.after or None,
            settings_changed_at=db_now(session),
            settings_changed_by=actor,
        ),
    )
    session.commit()
    session.refresh(ds)
    return saved == 1


def _drop_old_chunks(ctx: Context, ds: Dataset, job_ids: list[int], version: str) -> None:
    """A restamped job builds the new version: what an earlier attempt of it wrote under the old
    one (a failed or retrying job's partial chunks) would be claimed by no job. None of it serves
    search (a document's active job is never restamped)."""
    for job_id in job_ids:
        try:
            ctx.vectors.delete(
                ds.collection,
                where={"$and": [{"job_id": job_id}, {"pipeline_version": version}]},
            )
            lexical.delete_job(ctx.engine, job_id)
        except Exception as exc:  # reconcile finds and removes such orphans later
            log.warning(
                "job %s: could not remove its chunks of pipeline %s: %s", job_id, version, exc
            )


def apply(
    ctx: Context,
    name: str,
    assignments: dict[str, str | None],
    *,
    actor: str,
    publish: Callable[[int], None] | None = None,
) -> SettingsChange:
    """Save the dataset's new parse settings and rebuild its documents with them (that dataset
    only)."""
    change = propose(ctx, name, assignments, preview=False)
    if not change.ok:
        return change
    faults.hit("settings_proposed", dataset=name)
    with Session(ctx.engine) as session:
        ds = dataset_named(session, name)
        if not _save(session, ds, change, actor):
            return SettingsChange(
                False,
                f"dataset {name!r}: its settings changed meanwhile (by "
                f"{ds.settings_changed_by or 'someone'}); look at them again, then apply yours",
                dataset=name,
            )
        change.applied = True
        if change.from_version != change.to_version:
            change.restamped = jobs.restamp(
                session=session,
                dataset_id=ds.id,
                from_version=change.from_version,
                to_version=change.to_version,
                actor=actor,
            )
            _drop_old_chunks(ctx, ds, change.restamped, change.from_version)
    log.info(
        "dataset %s: parse settings %s -> %s by %s (pipeline %s -> %s)",
        name,
        change.before,
        change.after,
        actor,
        change.from_version,
        change.to_version,
    )
    if change.from_version == change.to_version:
        change.message = (
            f"dataset {name!r}: settings saved; its documents stay on pipeline {change.to_version}"
        )
        return change
    change.reindex = reindexing.reindex_all(ctx, actor=actor, dataset=name, publish=publish)
    r = change.reindex
    change.message = (
        f"dataset {name!r} now builds pipeline {change.to_version}: {r.queued} document(s) queued "
        f"for a rebuild"
        + (f", {r.underway} already under way" if r.underway else "")
        + (
            f", {len(change.restamped)} waiting job(s) switched to the new settings"
            if change.restamped
            else ""
        )
        + "; search keeps serving each document's current chunks until its new job succeeds"
    )
    if r.queue_error:
        change.message += f"; {queue_note(r.queue_error)}"
    return change
