"""Webhook events: written with the transition that ends a job, signed, and read back as a log.

A job that succeeds, becomes a dead letter or is cancelled gets one ``webhook_delivery`` row per
endpoint of ``SLUICE_WEBHOOK_URLS``, in the same transaction as its transition: the event exists
exactly when the transition does (and a source's sync run, its ``source.synced`` event, with the
transaction that finishes the run). ``sluice.pipeline.queueing.webhook_delivery`` posts the rows
later; nothing here touches the network, so a slow or dead endpoint never holds a job.

Signature scheme (what a receiver checks)::

    X-Sluice-Timestamp: <unix seconds when this attempt was sent, by the job database's clock>
    X-Sluice-Signature: v1=<hex HMAC-SHA256(SLUICE_WEBHOOK_SECRET, "<timestamp>.<raw body>")>
    X-Sluice-Event: job.succeeded | job.failed | job.cancelled | source.synced
    X-Sluice-Event-Id: <the event's id, the same for every endpoint and every retry>

The event id is the id of the transition's row in the job event log (in decimal): the same id the
API's event stream gives that transition, and the console's timeline shows (``source-run-<id>``
for a sync run).

The receiver recomputes the HMAC over the timestamp, a dot and the raw body bytes, compares in
constant time, and refuses a timestamp older than a few minutes (a replayed request keeps its old
timestamp, and changing it breaks the signature). Delivery is at least once: deduplicate on the
event id. ``verify`` below is a receiver's check, in Python.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Protocol

from sqlalchemy import func
from sqlmodel import Session, col, select

from sluice.settings import get_settings
from sluice.storage.clock import db_now
from sluice.storage.models import Dataset, Job, WebhookDelivery
from sluice.storage.source_records import Source, SourceRun, run_counts

EVENTS = ("job.succeeded", "job.failed", "job.cancelled")
SYNCED = "source.synced"
SIGNATURE_VERSION = "v1"
DEFAULT_TOLERANCE_SECONDS = 300.0


class Logged(Protocol):
    """A transition's job event as written (``sluice.storage.jobs.event_log``)."""

    @property
    def id(self) -> int | None: ...

    @property
    def job_id(self) -> int: ...


def event_body(session: Session, job: Job, event: str, *, event_id: str, at: datetime) -> str:
    """The JSON body of an event: what the job is, how it ended, and what to do about it."""
    dataset = session.get(Dataset, job.dataset_id)

    def value(v):
        v = getattr(v, "value", v)
        return v.isoformat() if isinstance(v, datetime) else v

    payload = {
        "id": event_id,
        "type": event,
        "occurred_at": at.isoformat(),
        "job": {
            "id": job.id,
            "status": value(job.status),
            "dataset": dataset.name if dataset else None,
            "dataset_id": job.dataset_id,
            "document_id": job.document_id,
            "filename": job.filename,
            "pipeline_version": job.pipeline_version,
            "attempt": job.attempt,
            "max_attempts": job.max_attempts,
            "chunk_count": job.chunk_count,
            "page_count": job.page_count,
            "error_kind": value(job.error_kind),
            "error_code": job.error_code,
            "error_message": job.error_message,
            "fix_hint": job.fix_hint,
            "created_at": value(job.created_at),
            "finished_at": value(job.finished_at),
        },
    }
    return json.dumps(payload, sort_keys=True, separators=(",", ":"))


def record(
    session: Session,
    job: Job,
    event: str,
    *,
    logged: Logged,
    endpoints: Sequence[str] | None = None,
) -> int:
    """Add the event's rows (one per endpoint) to the caller's transaction; returns how many.
    ``logged`` is the transition's job event: its id is the webhook's event id."""
    assert event in EVENTS, event
    endpoints = get_settings().webhook_urls if endpoints is None else endpoints
    if not endpoints:
        return 0
    if logged.id is None:
        session.flush()  # the log's id is handed out on insert, inside this transaction
    assert logged.id is not None and logged.job_id == job.id
    now = db_now(session)
    event_id = str(logged.id)
    body = event_body(session, job, event, event_id=event_id, at=now)
    for endpoint in endpoints:
        session.add(
            WebhookDelivery(
                event_id=event_id,
                endpoint=endpoint,
                job_id=job.id,
                event=event,
                body=body,
                created_at=now,
                next_attempt_at=now,
            )
        )
    return len(endpoints)


def record_synced(session: Session, *, source: Source, run: SourceRun, dataset: str) -> int:
    """Add a ``source.synced`` event (one row per endpoint) to the transaction that finishes the
    run; returns how many. Its rows name the source in ``source_id``: an endpoint gets one
    source's events in order, and no job's events wait on them."""
    endpoints = get_settings().webhook_urls
    if not endpoints:
        return 0
    now = db_now(session)
    event_id = f"source-run-{run.id}"
    body = json.dumps(
        {
            "id": event_id,
            "type": SYNCED,
            "occurred_at": now.isoformat(),
            "source": {"name": source.name, "kind": source.kind, "dataset": dataset},
            "run": run_counts(run),
        },
        sort_keys=True,
    )
    for endpoint in endpoints:
        session.add(
            WebhookDelivery(
                event_id=event_id,
                endpoint=endpoint,
                source_id=source.id,
                event=SYNCED,
                body=body,
                created_at=now,
                next_attempt_at=now,
            )
        )
    return len(endpoints)


def sign(secret: str, timestamp: int | str, body: bytes | str) -> str:
    """``v1=<hex>``: HMAC-SHA256 with the secret over ``"<timestamp>.<body>"``."""
    raw = body.encode() if isinstance(body, str) else body
    digest = hmac.new(secret.encode(), f"{timestamp}.".encode() + raw, hashlib.sha256).hexdigest()
    return f"{SIGNATURE_VERSION}={digest}"


def verify(
    secret: str,
    *,
    timestamp: str,
    body: bytes,
    signature: str,
    now: float,
    tolerance: float = DEFAULT_TOLERANCE_SECONDS,
) -> bool:
    """A receiver's check: the signature matches and the timestamp is recent (no replay)."""
    try:
        sent = int(timestamp)
    except (TypeError, ValueError):
        return False
    if abs(now - sent) > tolerance:
        return False
    return hmac.compare_digest(sign(secret, sent, body), signature or "")


def iso(value: datetime | None) -> str | None:
    """A stored time (naive UTC in SQLite and PostgreSQL alike) as an aware ISO string."""
    if value is None:
        return None
    return (value.replace(tzinfo=UTC) if value.tzinfo is None else value).isoformat()


def delivery_state(row: WebhookDelivery) -> str:
    if row.delivered_at is not None:
        return "delivered"
    if row.gave_up_at is not None:
        return "gave up"
    return "retrying" if row.attempts else "pending"


def recent(
    *, session: Session, endpoint: str | None = None, limit: int = 50
) -> list[WebhookDelivery]:
    """The latest deliveries, newest first (of one endpoint, or of all)."""
    query = select(WebhookDelivery).order_by(col(WebhookDelivery.id).desc()).limit(limit)
    if endpoint is not None:
        query = query.where(WebhookDelivery.endpoint == endpoint)
    return list(session.exec(query).all())


def summary(*, session: Session) -> list[dict]:
    """Per endpoint: deliveries delivered, waiting, given up, and the last delivery time."""
    rows = session.exec(
        select(  # type: ignore[call-overload]  # sqlmodel types select() up to 4 columns
            col(WebhookDelivery.endpoint),
            func.count(col(WebhookDelivery.delivered_at)),
            func.count(col(WebhookDelivery.id)).filter(
                col(WebhookDelivery.delivered_at).is_(None),
                col(WebhookDelivery.gave_up_at).is_(None),
            ),
            func.count(col(WebhookDelivery.gave_up_at)),
            func.max(WebhookDelivery.delivered_at),
        )
        .group_by(col(WebhookDelivery.endpoint))
        .order_by(col(WebhookDelivery.endpoint))
    ).all()
    return [
        {
            "endpoint": endpoint,
            "delivered": delivered,
            "waiting": waiting,
            "gave_up": gave_up,
            "last_delivered_at": iso(last),
        }
        for endpoint, delivered, waiting, gave_up, last in rows
    ]
