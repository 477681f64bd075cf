"""Webhook delivery: post due ``webhook_delivery`` rows, retry failures with backoff, give up late.

Every worker runs ``deliver_due`` in a thread of its own (``sluice.worker.hooks``), so a
slow endpoint delays only other webhooks, never a job nor the recovery loop. Each row is claimed by
compare-and-set on its attempt count before it is posted (the claim also moves its due time past
what one post may take), and its outcome is written only while that claim still holds: two
dispatchers never post one row at the same time, and a dispatcher that died mid-post leaves the row
to be posted again after the hold (delivery is at least once; receivers deduplicate on the event
id). All times are the job database's.

A failed post (a connection error, a timeout, any status but 2xx) is retried after an exponential
delay with full jitter (``RETRY_BASE_SECONDS`` doubling up to ``RETRY_MAX_SECONDS``) until the event
is older than ``SLUICE_WEBHOOK_MAX_AGE_SECONDS``; then the row is given up, with its last error.
After one failure of an endpoint, its other rows wait for the next round.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
from sqlalchemy import exists, or_, update
from sqlalchemy.engine import Engine
from sqlalchemy.orm import aliased
from sqlmodel import Session, col, select

from sluice import faults
from sluice.storage.clock import current_time, db_now
from sluice.storage.db import matched
from sluice.storage.jobs import backoff_delay
from sluice.storage.models import WebhookDelivery
from sluice.storage.webhook_records import sign

RETRY_BASE_SECONDS = 5.0
RETRY_MAX_SECONDS = 600.0
USER_AGENT = "sluice-webhooks/1"


@dataclass
class DeliveryReport:
    delivered: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)
    gave_up: list[int] = field(default_factory=list)
    lost: list[int] = field(default_factory=list)  # claimed by another dispatcher first

    @property
    def anything(self) -> bool:
        return bool(self.delivered or self.failed or self.gave_up)


def deliver_due(
    *,
    engine: Engine,
    secret: str,
    timeout: float,
    max_age_seconds: float,
    base: float = RETRY_BASE_SECONDS,
    cap: float = RETRY_MAX_SECONDS,
    limit: int = 100,
    rng: random.Random | None = None,
    transport: httpx.BaseTransport | None = None,
    hold_seconds: float | None = None,
) -> DeliveryReport:
    """Post the due rows once each (oldest first); returns what happened to them. A claimed row
    whose dispatcher died is due again after ``hold_seconds`` (by default longer than a post may
    take)."""
    report = DeliveryReport()
    with Session(engine) as session:
        now = db_now(session)
        due = session.exec(
            select(WebhookDelivery.id, WebhookDelivery.endpoint, WebhookDelivery.attempts)
            .where(
                col(WebhookDelivery.delivered_at).is_(None),
                col(WebhookDelivery.gave_up_at).is_(None),
                WebhookDelivery.next_attempt_at <= now,
                ~_earlier_waiting(),
            )
            .order_by(col(WebhookDelivery.id))
            .limit(limit)
        ).all()
    if not due:
        return report
    hold = timedelta(
        seconds=4 * timeout + 30 if hold_seconds is None else hold_seconds
    )  # connect, write, read
    down: set[str] = set()
    with httpx.Client(
        timeout=timeout,
        follow_redirects=False,
        transport=transport,
        headers={"User-Agent": USER_AGENT},
    ) as client:
        for row_id, endpoint, attempts in due:
            if endpoint in down:
                continue
            faults.hit("webhook_selected", delivery_id=row_id)
            claimed = _claim(engine, row_id, attempts, hold)
            if claimed is None:
                report.lost.append(row_id)
                continue
            row, sent_at = claimed
            faults.hit("webhook_claimed", delivery_id=row_id)
            status, error = _post(client, row, secret, int(sent_at.timestamp()))
            outcome = _finish(
                engine,
                row,
                status,
                error,
                max_age_seconds=max_age_seconds,
                base=base,
                cap=cap,
                rng=rng,
            )
            getattr(report, outcome).append(row_id)
            if outcome != "delivered":
                down.add(endpoint)
    return report


def _earlier_waiting():
    """An older event of the same job (or the same source) for the same endpoint is still to be
    delivered: this one waits for it, so an endpoint receives a job's events in the order they
    happened (a retried job's success never overtakes its failure that is backing off). One given
    up no longer holds the next."""
    earlier = aliased(WebhookDelivery)
    return (
        exists()
        .where(
            or_(
                earlier.job_id == WebhookDelivery.job_id,
                earlier.source_id == WebhookDelivery.source_id,
            ),
            earlier.endpoint == WebhookDelivery.endpoint,
            earlier.id < WebhookDelivery.id,
            earlier.delivered_at.is_(None),
            earlier.gave_up_at.is_(None),
        )
        .correlate(WebhookDelivery)
    )


def _claim(
    engine: Engine, row_id: int, attempts: int, hold: timedelta
) -> tuple[WebhookDelivery, datetime] | None:
    """Take the row for one post if nobody took it since we read it (its attempt count is
    unchanged); returns it with the database's time of the claim (the timestamp the post is signed
    with)."""
    with Session(engine, expire_on_commit=False) as session:
        now = db_now(session)
        taken = (
            matched(
                session,
                update(WebhookDelivery)
                .where(
                    col(WebhookDelivery.id) == row_id,
                    col(WebhookDelivery.attempts) == attempts,
                    col(WebhookDelivery.delivered_at).is_(None),
                    col(WebhookDelivery.gave_up_at).is_(None),
                    col(WebhookDelivery.next_attempt_at) <= now,
                    ~_earlier_waiting(),
                )
                .values(attempts=attempts + 1, next_attempt_at=now + hold)
                .execution_options(synchronize_session=False),
            )
            == 1
        )
        if not taken:
            session.rollback()
            return None
        session.commit()
        row = session.get(WebhookDelivery, row_id, populate_existing=True)
        return (row, now) if row is not None else None  # None: pruned since it was taken


def _post(
    client: httpx.Client, row: WebhookDelivery, secret: str, timestamp: int
) -> tuple[int | None, str | None]:
    """One signed POST; returns (HTTP status or None, error text or None when delivered)."""
    body = row.body.encode()
    headers = {
        "Content-Type": "application/json",
        "X-Sluice-Timestamp": str(timestamp),
        "X-Sluice-Signature": sign(secret, timestamp, body),
        "X-Sluice-Event": row.event,
        "X-Sluice-Event-Id": row.event_id,
        "X-Sluice-Delivery": str(row.id),
    }
    try:
        response = client.post(row.endpoint, content=body, headers=headers)
    except httpx.TimeoutException as exc:
        return None, f"timed out: {type(exc).__name__}"
    except httpx.HTTPError as exc:
        return None, f"{type(exc).__name__}: {exc}"[:500]
    if 200 <= response.status_code < 300:
        return response.status_code, None
    return response.status_code, f"HTTP {response.status_code}: {response.text[:200]}"


def _finish(
    engine: Engine,
    row: WebhookDelivery,
    status: int | None,
    error: str | None,
    *,
    max_age_seconds: float,
    base: float,
    cap: float,
    rng: random.Random | None,
) -> str:
    """Record the post's outcome while our claim holds; returns delivered / failed / gave_up /
    lost."""
    with Session(engine) as session:
        ours = [
            col(WebhookDelivery.id) == row.id,
            col(WebhookDelivery.attempts) == row.attempts,
            col(WebhookDelivery.delivered_at).is_(None),
            col(WebhookDelivery.gave_up_at).is_(None),
        ]
        values: dict[str, Any]
        if error is None:
            values, outcome = (
                {"delivered_at": current_time(), "last_status": status, "last_error": None},
                "delivered",
            )
        else:
            now = db_now(session)
            if (now - _aware(row.created_at)).total_seconds() >= max_age_seconds:
                values, outcome = {"gave_up_at": now}, "gave_up"
            else:
                _, delay = backoff_delay(row.attempts, base=base, cap=cap, rng=rng)
                values, outcome = {"next_attempt_at": now + timedelta(seconds=delay)}, "failed"
            values.update(last_status=status, last_error=error[:500])
        done = (
            matched(
                session,
                update(WebhookDelivery)
                .where(*ours)
                .values(**values)
                .execution_options(synchronize_session=False),
            )
            == 1
        )
        session.commit()
    return outcome if done else "lost"


def _aware(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value
