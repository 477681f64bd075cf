"""``GET /v1/audit``: the audit log (who changed what, when, from where), newest first, by cursor;
for a manage key of every dataset only (403 for any other key)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from pydantic import BaseModel, ConfigDict

from sluice.api import examples
from sluice.api.dependencies import Key
from sluice.api.schemas import problems
from sluice.api.scoped import ScopeMissing
from sluice.ops import audit_trail

router = APIRouter(prefix="/v1/audit", tags=["audit"])
TEXT = r"^[^\x00-\x1f]*$"  # no control characters (PostgreSQL takes no NUL in a string)


class AuditRow(BaseModel):
    id: int
    at: str
    actor_kind: str
    actor_name: str
    actor_key: str | None
    address: str | None
    action: str
    target_kind: str
    target_id: str | None
    dataset: str | None
    params: dict[str, Any]
    outcome: str
    code: str | None
    reason: str


class AuditList(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [examples.AUDIT]})
    entries: list[AuditRow]
    next_cursor: str | None


@router.get("", response_model=AuditList, responses=problems(401, 403, 422, 429))
def list_audit(
    key: Key,
    since: Annotated[
        str | None,
        Query(max_length=40, pattern=TEXT, description="a span back (2h, 30m, 7d) or an ISO time"),
    ] = None,
    actor: Annotated[str | None, Query(max_length=120, pattern=TEXT)] = None,
    action: Annotated[
        str | None,
        Query(max_length=40, pattern=TEXT, description="an action (job.retry) or a family (job)"),
    ] = None,
    dataset: Annotated[str | None, Query(max_length=64, pattern=TEXT)] = None,
    outcome: Annotated[str | None, Query(pattern=r"^(done|refused)$")] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: Annotated[str | None, Query(pattern=r"^[0-9]{1,10}$")] = None,
) -> dict:
    if not (key.all_datasets and key.allows("manage")):
        raise ScopeMissing(f"key {key.name!r}: the audit log needs a manage key of every dataset")
    rows = audit_trail.rows(  # a BadAuditQuery answers 422 invalid_request by itself
        since=since,
        actor=actor,
        action=action,
        dataset=dataset,
        outcome=outcome,
        before_id=int(cursor) if cursor else None,
        limit=limit,
    )
    more = len(rows) == limit and rows[-1]["id"] > 1
    return {"entries": rows, "next_cursor": str(rows[-1]["id"]) if more else None}
