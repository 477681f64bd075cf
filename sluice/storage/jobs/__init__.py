"""The job state machine: every transition of a job lives here.

Every update is conditional (``conditional``): a compare-and-set on ``version`` for operator and
claim transitions, and on the fencing token ``lease`` (plus status running) for what a worker
writes during its attempt. A
transition that loses the race changes nothing and says so. Each transition writes a JobEvent in
the same transaction; transitions that need the job published again write an Outbox row too, and
the final ones (succeeded, failed, cancelled) their webhook events (``storage.webhooks``).

    pending ──claim──▶ running ──succeed──▶ succeeded ──reindex──▶ pending
       ▲                 │ fail(transient, budget left) ▶ retrying ──claim──▶ running
       │                 │ fail(otherwise) ▶ failed (dead letter) ──retry──▶ pending
       │                 │ cancel_requested ▶ cancelled ──retry──▶ pending
       └── retry ────────┘ reaper: heartbeat older than the lease = transient failure
       └──── hand_back (the worker stops in order; attempt not counted) ◀── running
    succeeded ──a newer pipeline version of the document succeeds──▶ superseded ──revive──▶ pending
    any ──mark_deleted (the document is deleted)──▶ deleted
        ──the same bytes uploaded again──▶ pending
    a waiting rebuild of the active job ──its dataset's settings change──▶ succeeded
        (rebuild dropped)
    running, of a version no worker makes ──follow_version──▶ running (the version in force), or
        succeeded (it was the active job's rebuild), or superseded (that version has its own job)
"""

from __future__ import annotations

from sluice.storage.jobs.attempt_fence import hold_for_cleanup
from sluice.storage.jobs.claiming import claim, heartbeat, progress
from sluice.storage.jobs.conditional import CLAIMABLE_UNPAUSED, RUNNING_UNCANCELLED, Condition
from sluice.storage.jobs.creation import create_job, create_upload, idempotency_key
from sluice.storage.jobs.deletion import delete_jobs_of, mark_deleted
from sluice.storage.jobs.endings import acknowledge_cancel, fail, hand_back
from sluice.storage.jobs.event_log import add_event, describe_progress
from sluice.storage.jobs.job_values import ActionResult, Built, ClaimResult, JobError
from sluice.storage.jobs.lookups import cancel_requested, get_job, owns, running_on
from sluice.storage.jobs.operator_actions import (
    action_rejected,
    dismiss,
    reindex,
    request_cancel,
    retry,
    revive,
    run_next,
    set_dataset_priority,
    set_priority,
)
from sluice.storage.jobs.outbox_row import republish
from sluice.storage.jobs.reaping import ReaperState, ReaperTick, reap, reaper_state, reaper_tick
from sluice.storage.jobs.retry_policy import RetryPolicy, WaitPolicy, backoff_delay
from sluice.storage.jobs.statuses import (
    CANCELLABLE,
    CLAIMABLE,
    RESTAMPABLE,
    RETRYABLE,
    SUPERSEDABLE,
)
from sluice.storage.jobs.success import succeed
from sluice.storage.jobs.version_moves import (
    ACTION_FOR_STATUS,
    ensure_version_job,
    follow_version,
    move_waiting,
    restamp,
    stamped_before,
)
from sluice.storage.models import MAX_ID

__all__ = [
    "ACTION_FOR_STATUS",
    "CANCELLABLE",
    "CLAIMABLE",
    "CLAIMABLE_UNPAUSED",
    "MAX_ID",
    "RESTAMPABLE",
    "RETRYABLE",
    "RUNNING_UNCANCELLED",
    "SUPERSEDABLE",
    "ActionResult",
    "Built",
    "ClaimResult",
    "Condition",
    "JobError",
    "ReaperState",
    "ReaperTick",
    "RetryPolicy",
    "WaitPolicy",
    "acknowledge_cancel",
    "action_rejected",
    "add_event",
    "backoff_delay",
    "cancel_requested",
    "claim",
    "create_job",
    "create_upload",
    "delete_jobs_of",
    "describe_progress",
    "dismiss",
    "ensure_version_job",
    "fail",
    "follow_version",
    "get_job",
    "hand_back",
    "heartbeat",
    "hold_for_cleanup",
    "idempotency_key",
    "mark_deleted",
    "move_waiting",
    "owns",
    "progress",
    "reap",
    "reaper_state",
    "reaper_tick",
    "reindex",
    "republish",
    "request_cancel",
    "restamp",
    "retry",
    "revive",
    "run_next",
    "running_on",
    "set_dataset_priority",
    "set_priority",
    "stamped_before",
    "succeed",
]
