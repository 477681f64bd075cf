"""Retention: what the job database may forget after ``SLUICE_RETENTION_DAYS``.

- A succeeded job finished before the cutoff keeps its row and its last ``succeeded`` event (what it
  built, from which version, when); the rest of its event history goes.
- A superseded job (an older pipeline version of a document whose newer job serves search) finished
  before the cutoff goes entirely, with its events and outbox rows: its chunks were removed when it
  was superseded.
- Outbox rows published before the cutoff go (they only ever mattered until sent), and so do
  webhook deliveries delivered or given up before it (the rest are still being tried).
- The HTTP API's idempotency records go once they are older than their 24 hours
  (``idempotency_records.TTL``), whatever the cutoff: a request never deletes them.
- Audit log rows go after ``SLUICE_AUDIT_RETENTION_DAYS`` (default 365), not the cutoff.
- Dead letters stay, with their history, until an operator dismisses them; a dismissed one is then
  treated like a succeeded job: its row and its final ``failed`` event stay.
- Active, cancelled and deleted jobs are never touched.

``prune(dry_run=True)`` counts without deleting; the same call without it deletes those rows.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime

from sqlalchemy import delete, func, true, update
from sqlmodel import Session, col, select

from sluice import faults
from sluice.settings import get_settings
from sluice.storage import audit_log, idempotency_records
from sluice.storage.db import matched
from sluice.storage.models import Job, JobEvent, JobStatus, Outbox, WebhookDelivery

BATCH = 500


@dataclass
class PruneReport:
    cutoff: str
    dry_run: bool
    events: int = 0  # event rows of old succeeded / dismissed jobs
    superseded_jobs: int = 0  # superseded job rows, with their events and outbox rows
    outbox: int = 0  # published outbox rows
    webhooks: int = 0  # webhook deliveries delivered or given up
    idempotency: int = 0  # the API's idempotency records past their 24 hours
    audit: int = 0  # audit log rows older than SLUICE_AUDIT_RETENTION_DAYS

    def to_dict(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        verb = "would remove" if self.dry_run else "removed"
        return (
            f"older than {self.cutoff[:19]}: {verb} {self.events:,} event(s) of finished jobs, "
            f"{self.superseded_jobs:,} superseded job(s), {self.outbox:,} published outbox row(s) "
            f"and {self.webhooks:,} finished webhook delivery(ies), and {self.idempotency:,} "
            f"idempotency record(s) past 24 hours, and {self.audit:,} audit row(s) past "
            "SLUICE_AUDIT_RETENTION_DAYS; dead letters not dismissed are kept"
        )


def _finished(cutoff: datetime):
    """Jobs whose older history may go: succeeded, or dismissed dead letters, finished before it."""
    return (col(Job.finished_at) < cutoff) & (
        (col(Job.status) == JobStatus.succeeded)
        | ((col(Job.status) == JobStatus.failed) & col(Job.dismissed).is_(True))
    )


def _kept_history(session: Session, cutoff: datetime) -> list[tuple[int, str]]:
    """(job id, the kind of its one event to keep) of jobs whose older history may go."""
    finished = select(Job.id, Job.status).where(_finished(cutoff))
    return [
        (jid, "succeeded" if JobStatus(status) == JobStatus.succeeded else "failed")
        for jid, status in session.exec(finished).all()
    ]


def _delete_superseded(session: Session, part: list[int], cutoff: datetime) -> None:
    """Delete the jobs of ``part`` that are still superseded and old, with their events and outbox
    rows, in one transaction. The jobs are taken first by a write on their compare-and-set version
    (a revive that lands after it loses; one that landed before leaves its job out), so the history
    and the outbox row of a job that came back are never deleted without the job."""
    taken = list(
        session.execute(
            update(Job)
            .where(
                col(Job.id).in_(part),
                col(Job.status) == JobStatus.superseded,
                col(Job.updated_at) < cutoff,
            )
            .values(version=Job.version + 1)
            .returning(col(Job.id))
        )
        .scalars()
        .all()
    )
    if taken:
        session.execute(delete(JobEvent).where(col(JobEvent.job_id).in_(taken)))
        session.execute(delete(Outbox).where(col(Outbox.job_id).in_(taken)))
        session.execute(delete(Job).where(col(Job.id).in_(taken)))
    session.commit()


def prune(
    *, session: Session, cutoff: datetime, dry_run: bool, audit_days: int | None = None
) -> PruneReport:
    report = PruneReport(cutoff=cutoff.isoformat(), dry_run=dry_run)
    # events of old finished jobs, all but the last one of the kind that says how it ended
    jobs = _kept_history(session, cutoff)
    faults.hit("prune_history_selected", job_ids=[jid for jid, _ in jobs])
    for start in range(0, len(jobs), BATCH):
        part = jobs[start : start + BATCH]
        ids = [jid for jid, _ in part]
        ending = dict(part)
        last = session.exec(
            select(JobEvent.job_id, JobEvent.kind, func.max(JobEvent.id))
            .where(col(JobEvent.job_id).in_(ids), col(JobEvent.kind).in_(("succeeded", "failed")))
            .group_by(col(JobEvent.job_id), JobEvent.kind)
        ).all()
        keep = [event_id for jid, kind, event_id in last if ending[jid] == kind]
        # Only while the job is still the finished one read above: a reindex or a retry that lands
        # meanwhile starts a new history, which is not this prune's to forget.
        still = select(Job.id).where(col(Job.id).in_(ids), _finished(cutoff))
        condition = col(JobEvent.job_id).in_(still) & (
            col(JobEvent.id).not_in(keep) if keep else true()
        )
        if dry_run:
            report.events += session.exec(
                select(func.count()).select_from(JobEvent).where(condition)
            ).one()
        else:
            report.events += matched(session, delete(JobEvent).where(condition))
            session.commit()
    # superseded versions, whole
    superseded = list(
        session.exec(
            select(Job.id).where(Job.status == JobStatus.superseded, Job.updated_at < cutoff)
        ).all()
    )
    report.superseded_jobs = len(superseded)
    if not dry_run:
        for start in range(0, len(superseded), BATCH):
            batch = superseded[start : start + BATCH]
            faults.hit("prune_selected", job_ids=batch)
            _delete_superseded(session, batch, cutoff)
    # outbox rows long since published
    sent = col(Outbox.sent_at).is_not(None) & (col(Outbox.sent_at) < cutoff)
    if superseded and dry_run:  # counted with their jobs above
        sent = sent & col(Outbox.job_id).not_in(superseded)
    if dry_run:
        report.outbox = session.exec(select(func.count()).select_from(Outbox).where(sent)).one()
    else:
        report.outbox = matched(session, delete(Outbox).where(sent))
        session.commit()
    # webhook deliveries that are over (delivered or given up)
    over = (col(WebhookDelivery.delivered_at) < cutoff) | (col(WebhookDelivery.gave_up_at) < cutoff)
    if dry_run:
        report.webhooks = session.exec(
            select(func.count()).select_from(WebhookDelivery).where(over)
        ).one()
    else:
        report.webhooks = matched(session, delete(WebhookDelivery).where(over))
        session.commit()
    report.idempotency = idempotency_records.prune(session=session, dry_run=dry_run)
    days = get_settings().audit_retention_days if audit_days is None else audit_days
    report.audit = audit_log.prune(session=session, days=days, dry_run=dry_run)
    return report
