"""The values the job store takes from a worker's attempt and gives back to its callers."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sluice.errors import ErrorKind, PipelineError
from sluice.storage.models import Dataset, Document, Job


@dataclass(frozen=True)
class ClaimResult:
    job: Job | None
    claimed: bool
    reason: str = ""
    # read with the claim, as they were then (a claim that holds has them)
    document: Document | None = None
    dataset: Dataset | None = None


@dataclass(frozen=True)
class ActionResult:
    job_id: int
    ok: bool
    message: str


@dataclass(frozen=True)
class JobError:
    """Why an attempt failed, as the job's error columns keep it."""

    kind: ErrorKind
    code: str
    message: str
    hint: str = ""
    detail: str = ""

    @classmethod
    def of(cls, err: PipelineError) -> JobError:
        """The error of a classified exception."""
        return cls(err.kind, err.code, err.message, err.hint, err.detail)

    def columns(self, page_count: int | None = None) -> dict[str, Any]:
        """The job's error columns (and its page count, when the attempt got that far)."""
        errors: dict[str, Any] = dict(
            error_kind=self.kind,
            error_code=self.code,
            error_message=self.message,
            fix_hint=self.hint,
            error_detail=self.detail[-8000:] if self.detail else None,
        )
        if page_count is not None:
            errors["page_count"] = page_count
        return errors


@dataclass(frozen=True)
class Built:
    """What a successful attempt built: the counts its success records, its warnings (a page
    skipped, a file that needed repair) and its seconds per stage."""

    chunks: int
    pages: int
    embedded: int
    cached: int
    warnings: Sequence[str] = ()
    stages: Mapping[str, float] = field(default_factory=dict)
    edits_seen: int | None = None  # the newest chunk edit the run applied (None: not checked)
