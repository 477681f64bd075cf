"""The audit log: one row per change an operator, a CLI user or an API key made (or was refused).

Who (actor kind and name, the API key's public lookup id, the source address), what (action and
parameters), target (kind, id, dataset), outcome (``done``, or ``refused`` with the reason) and when
(the database's clock, ``clock.current_time``). A ``done`` row is added to the session of the change
it records, so it commits or rolls back with it (sluice.ops.audit does that); a ``refused`` row is
written in a transaction of its own.

Parameters never hold a secret: ``scrub`` (the one place) drops values under a secret-looking key
and masks values that look like a token or a credential, at any depth.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Any, cast

from sqlalchemy import JSON, Column, Index, Text, delete, func
from sqlalchemy.engine import CursorResult
from sqlmodel import Field, Session, SQLModel, col, select

from sluice.storage.clock import current_time, db_now

OUTCOMES = ("done", "refused")
ACTOR_KINDS = ("console", "cli", "api", "system")
MASK = "[redacted]"
SECRET_KEY = re.compile(
    r"(pass(word|wd|phrase)?|secret|token|api[_-]?key|authori[sz]ation|credential|cookie|"
    r"private[_-]?key|signature|session[_-]?id)",
    re.IGNORECASE,
)
SECRET_VALUE = re.compile(
    r"(sluice_[0-9a-f]{12}_[A-Za-z0-9_-]{8,}"  # an API token
    r"|\bBearer\s+\S+"
    r"|-----BEGIN [A-Z ]*PRIVATE KEY-----"
    r"|\b(AKIA|ASIA)[0-9A-Z]{16}\b"  # an AWS access key id
    r"|\b(gh[pousr]|xox[abp]|sk)[-_][A-Za-z0-9_-]{16,}"
    r"|://[^/\s:@]+:[^/\s@]+@)",  # a URL with user:password@
    re.IGNORECASE,
)
MAX_TEXT = 500


class AuditEntry(SQLModel, table=True):
    __tablename__ = "audit_log"
    __table_args__ = (
        Index("ix_audit_at_id", "at", "id"),
        Index("ix_audit_action_at", "action", "at"),
        Index("ix_audit_actor_at", "actor_name", "at"),
        Index("ix_audit_dataset_at", "dataset", "at"),
    )

    id: int = Field(default=None, primary_key=True)
    at: datetime = Field(default=None)  # set from the database's clock when the row is written
    actor_kind: str = Field(max_length=10)  # console, cli, api or system
    actor_name: str = Field(max_length=120)
    actor_key: str | None = Field(default=None, max_length=32)  # an API key's lookup id
    address: str | None = Field(default=None, max_length=64)
    action: str = Field(max_length=40)
    target_kind: str = Field(default="", max_length=20)
    target_id: str | None = Field(default=None, max_length=120)
    dataset: str | None = Field(default=None, max_length=64)
    params: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON))
    outcome: str = Field(default="done", max_length=10)
    code: str | None = Field(default=None, max_length=60)
    reason: str = Field(default="", sa_column=Column(Text))


def scrub(value: Any, key: str = "") -> Any:
    """``value`` with nothing secret left in it: values under a secret-looking key become MASK,
    strings that look like a token or a credential too, nested dicts and lists alike."""
    if key and SECRET_KEY.search(key):
        return MASK
    if isinstance(value, dict):
        return {str(k): scrub(v, str(k)) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [scrub(v) for v in value]
    if isinstance(value, str):
        return MASK if SECRET_VALUE.search(value) else value[:MAX_TEXT]
    if value is None or isinstance(value, bool | int | float):
        return value
    return scrub(str(value))


def entry(
    *,
    actor_kind: str,
    actor_name: str,
    action: str,
    actor_key: str | None = None,
    address: str | None = None,
    target_kind: str = "",
    target_id: str | int | None = None,
    dataset: str | None = None,
    params: dict[str, Any] | None = None,
    outcome: str = "done",
    code: str | None = None,
    reason: str = "",
) -> AuditEntry:
    """A row (not yet added), its parameters scrubbed and its time the database's."""
    row = AuditEntry(
        actor_kind=actor_kind if actor_kind in ACTOR_KINDS else "system",
        actor_name=actor_name[:120],
        actor_key=actor_key or None,
        address=(address or None) and address[:64],
        action=action,
        target_kind=target_kind,
        target_id=None if target_id is None else str(target_id)[:120],
        dataset=dataset,
        params=scrub(params or {}),
        outcome=outcome if outcome in OUTCOMES else "refused",
        code=code,
        reason=scrub(reason or "")[:MAX_TEXT],
    )
    row.at = cast(datetime, current_time())  # evaluated by the INSERT: the database's clock
    return row


def write(*, session: Session, row: AuditEntry) -> None:
    """Write one row in a transaction of its own (a refusal: there is no change to ride with)."""
    session.add(row)
    session.commit()


def entries(
    *,
    session: Session,
    since: datetime | None = None,
    actor: str | None = None,
    action: str | None = None,
    dataset: str | None = None,
    outcome: str | None = None,
    before_id: int | None = None,
    limit: int = 50,
) -> list[AuditEntry]:
    """Rows newest first, filtered; ``before_id`` continues a page (rows older than that one).
    ``action`` matches a whole action or a family (``job`` finds ``job.retry`` and
    ``job.cancel``)."""
    query = select(AuditEntry)
    if since is not None:
        query = query.where(col(AuditEntry.at) >= since)
    if actor:
        query = query.where(col(AuditEntry.actor_name) == actor)
    if action:
        query = query.where(
            (col(AuditEntry.action) == action) | col(AuditEntry.action).startswith(f"{action}.")
        )
    if dataset:
        query = query.where(col(AuditEntry.dataset) == dataset)
    if outcome:
        query = query.where(col(AuditEntry.outcome) == outcome)
    if before_id is not None:
        query = query.where(col(AuditEntry.id) < before_id)
    query = query.order_by(col(AuditEntry.id).desc()).limit(limit)
    return list(session.exec(query).all())


def prune(*, session: Session, days: int, dry_run: bool) -> int:
    """Rows older than ``days`` (0: keep every row): how many went, or would go."""
    if days <= 0:
        return 0
    old = col(AuditEntry.at) < db_now(session) - timedelta(days=days)
    if dry_run:
        return int(session.exec(select(func.count()).select_from(AuditEntry).where(old)).one())
    gone = cast("CursorResult[Any]", session.execute(delete(AuditEntry).where(old))).rowcount
    session.commit()
    return int(gone)
