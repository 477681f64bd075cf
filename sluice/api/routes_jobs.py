"""``/v1/jobs``: a job's state (with ``ETag``, and ``Retry-After`` while it is not final), jobs by
cursor, and retry, cancel and unlock: the console's actions, with the console's words."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import JSONResponse, Response

from sluice.api import scoped
from sluice.api.dependencies import Key
from sluice.api.problems import Problem
from sluice.api.replay import idempotent
from sluice.api.routes_metadata import Where
from sluice.api.schemas import (
    ActionOut,
    JobId,
    JobList,
    JobOut,
    UnlockIn,
    problems,
    where_parameter,
)
from sluice.ops.actions import ActionReport
from sluice.ops.keys import ApiPrincipal

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])
Status = Query(description="only jobs with this status (repeat for several)")
STATUSES = (
    "pending",
    "running",
    "retrying",
    "succeeded",
    "failed",
    "cancelled",
    "superseded",
    "deleted",
)


def retry_after(state: dict[str, Any]) -> int | None:
    """How long a poller should wait before asking again (None once the job is final)."""
    if state["final"]:
        return None
    due = (state.get("waiting") or {}).get("starts_at")
    if due:
        seconds = (
            datetime.fromisoformat(due).replace(tzinfo=UTC) - datetime.now(UTC)
        ).total_seconds()
        return int(min(60, max(1, seconds)))
    return 1 if state["status"] == "running" else 2


def _etag(body: str) -> str:
    return '"' + hashlib.sha256(body.encode()).hexdigest()[:32] + '"'


@router.get(
    "/{job_id}",
    response_model=JobOut,
    responses={304: {"description": "not modified"}, **problems(401, 404, 429)},
)
def get_job(
    job_id: JobId, key: Key, if_none_match: Annotated[str | None, Header()] = None
) -> Response:
    state = scoped.job(key, job_id)
    body = json.dumps(state, separators=(",", ":"), sort_keys=True)
    headers = {"ETag": _etag(body), "Cache-Control": "private, no-cache"}
    wait = retry_after(state)
    if wait is not None:
        headers["Retry-After"] = str(wait)
    if if_none_match and headers["ETag"] in [t.strip() for t in if_none_match.split(",")]:
        return Response(status_code=304, headers=headers)
    return Response(body, media_type="application/json", headers=headers)


@router.get(
    "",
    response_model=JobList,
    responses=problems(401, 404, 422, 429),
    openapi_extra={"parameters": [where_parameter("jobs of documents this filter allows")]},
)
def list_jobs(
    key: Key,
    where: Where,
    dataset: str | None = None,
    status: Annotated[list[str] | None, Status] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: Annotated[str | None, Query(pattern=r"^[0-9]{1,10}$")] = None,
) -> dict:
    unknown = [s for s in status or [] if s not in STATUSES]
    if unknown:
        raise Problem(
            422, "invalid_request", f"status {unknown[0]!r}: one of {', '.join(STATUSES)}"
        )
    page = scoped.jobs(
        key,
        dataset=dataset,
        statuses=status or [],
        limit=limit,
        cursor=cursor,
        where=where,
    )
    return {"jobs": page.jobs, "next_cursor": page.next_cursor}


def _action(key: ApiPrincipal, job_id: int, report: ActionReport) -> Response:
    first = report.results[0] if report.results else None
    if first is None or not first.ok:
        raise Problem(409, "action_refused", first.message if first else "nothing was done")
    body = {
        "ok": True,
        "message": first.message,
        "queue_note": report.queue_note,
        "warnings": report.warnings,
        "job": scoped.job(key, job_id),
    }
    return JSONResponse(body)


ACTION_RESPONSES = problems(401, 403, 404, 409, 422, 429)


@router.post("/{job_id}/retry", response_model=ActionOut, responses=ACTION_RESPONSES)
def retry(job_id: JobId, request: Request, key: Key) -> Response:
    return idempotent(
        request, key, [job_id], lambda: _action(key, job_id, scoped.retry(key, job_id))
    )


@router.post("/{job_id}/cancel", response_model=ActionOut, responses=ACTION_RESPONSES)
def cancel(job_id: JobId, request: Request, key: Key) -> Response:
    return idempotent(
        request, key, [job_id], lambda: _action(key, job_id, scoped.cancel(key, job_id))
    )


@router.post("/{job_id}/unlock", response_model=ActionOut, responses=ACTION_RESPONSES)
def unlock(job_id: JobId, body: UnlockIn, request: Request, key: Key) -> Response:
    """A password-protected PDF: the password decrypts it in a child process and the job is
    retried; it reaches no database, queue, log or event (and is not part of the idempotency
    fingerprint)."""
    return idempotent(
        request,
        key,
        [job_id, "password given"],
        lambda: _action(key, job_id, scoped.unlock(key, job_id, body.password)),
    )
