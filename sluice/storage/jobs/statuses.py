"""The sets of statuses a transition starts from."""

from __future__ import annotations

from sluice.storage.models import JobStatus

CLAIMABLE = (JobStatus.pending, JobStatus.retrying)
RETRYABLE = (JobStatus.failed, JobStatus.cancelled)
CANCELLABLE = (JobStatus.pending, JobStatus.retrying, JobStatus.running)
SUPERSEDABLE = (JobStatus.succeeded, JobStatus.pending, JobStatus.running, JobStatus.retrying)
RESTAMPABLE = (JobStatus.pending, JobStatus.retrying, JobStatus.failed)
