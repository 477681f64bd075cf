"""A job of a pipeline version its worker does not make: wait for a worker of it, or build the
version in force.

Chunk ids carry the job's version, so a worker never chunks a job with other settings under the old
version. It waits (the attempt not counted) while a worker of that version may still come: during
a rolling change of the process settings, old and new workers run side by side. It builds the
version in force instead (``jobs.follow_version``) when none will: the dataset's own settings
changed after the job got its version (every worker reads those from the job database), or it
has already waited longer than SLUICE_MAX_OUTAGE_SECONDS for one.
"""

from __future__ import annotations

from sqlmodel import Session

from sluice.errors import WaitingError
from sluice.pipeline.running.context import Context
from sluice.storage import jobs
from sluice.storage.clock import db_now
from sluice.storage.models import Dataset, Job

MISMATCH = "pipeline_version_mismatch"


def follow(ctx: Context, job: Job, dataset: Dataset, version: str) -> str:
    """``moved`` (``job`` now builds ``version``), ``succeeded`` or ``superseded`` (nothing left
    to build; see ``jobs.follow_version``); raises WaitingError while a worker of the job's own
    version may still come."""
    with Session(ctx.engine) as session:
        reason = _no_worker_comes(ctx, session, job, dataset)
        if reason:
            outcome = jobs.follow_version(
                session=session,
                job_id=job.id,
                lease=job.lease,
                to_version=version,
                actor=ctx.worker_id,
                reason=reason,
            )
            if outcome == "moved":
                job.pipeline_version = version
            if outcome != "lost":
                return outcome
    raise WaitingError(
        MISMATCH,
        f"this job builds pipeline version {job.pipeline_version}, but this worker's chunking and "
        f"model settings (with dataset {dataset.name!r}'s own) make {version}",
        "Give every worker the same SLUICE_CHUNK_* and SLUICE_EMBED* settings as the console, or "
        f"run `sluice reindex --all --dataset {dataset.name}` to build the version now in force.",
        waiting_for=f"a worker of pipeline {job.pipeline_version}",
    )


def _no_worker_comes(ctx: Context, session: Session, job: Job, dataset: Dataset) -> str:
    """Why no worker of the job's version will come ('' while one may)."""
    if jobs.stamped_before(session=session, job=job, moment=dataset.settings_changed_at):
        return f"dataset {dataset.name!r}'s parse settings changed after this job was queued"
    if job.error_code == MISMATCH and job.waiting_since is not None:
        waited = (db_now(session) - job.waiting_since).total_seconds()
        if waited > ctx.settings.max_outage_seconds:
            return (
                f"no worker of pipeline {job.pipeline_version} came in {waited / 3600:.1f} h "
                "(SLUICE_MAX_OUTAGE_SECONDS)"
            )
    return ""
