"""The job event log as a stream of typed events for one API key (``GET /v1/events``).

One ordered log is behind the console's timeline, the webhooks and this stream: the ``job_event``
rows, whose ids are the stream's event ids. A client that resumes after id N gets every later event
of its datasets once, in order, whichever process serves it.

Ids are handed out when a row is inserted, not when its transaction commits: id 11 may be visible
before id 10 is. So a reader stops before a gap in the ids until the event after the gap is
``GAP_WAIT_SECONDS`` old by the database's clock (a transaction still open commits within that; a
gap that stays is a rolled-back insert or a pruned row). Without that, a client that saw 11 would
never see 10.

A stream is only as good as its key: every poll reads the key's row again (a revoked key, or one
gone, ends the stream: ``StreamEnded``) and checks that each dataset it reached at the start is
still the same dataset (its id and its creation time: a dataset deleted and a new one that got its
id is not the old one). A dataset gone leaves the stream's reach; the last one gone ends it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from sqlmodel import Session, col, select

from sluice.api.scoped import Missing
from sluice.ops import reads
from sluice.ops.keys import ApiPrincipal
from sluice.storage import api_keys, api_queries, queries
from sluice.storage.clock import as_utc, db_now
from sluice.storage.models import MAX_ID, Dataset, Job, JobEvent

GAP_WAIT_SECONDS = 2.0
BATCH = 500
EVENT_TYPES = {  # job event kind -> the stream's (and the webhooks') event type
    "created": "job.queued",
    "retried": "job.queued",
    "reindex_requested": "job.queued",
    "reuploaded": "job.queued",
    "handed_back": "job.queued",  # a stopping worker gave it back: pending again
    "revived": "job.queued",
    "claimed": "job.progress",
    "progress": "job.progress",  # stage counts, written once per batch at most twice a second
    "waiting": "job.progress",
    "unlocked": "job.progress",
    "attempt_failed": "job.retrying",
    "succeeded": "job.succeeded",
    "failed": "job.failed",
    "cancelled": "job.cancelled",
    "deleted": "document.deleted",
    "metadata_changed": "document.metadata_changed",  # by PATCH, or a re-upload of the same bytes
}


@dataclass(frozen=True)
class StreamEvent:
    id: int
    type: str
    data: dict[str, Any]


class StreamEnded(Exception):
    """The stream may deliver nothing more: its key was revoked, or its datasets are gone. The
    message says why, in words for the stream's last comment."""


@dataclass
class EventCursor:
    """Where one stream is in the log, which datasets it may see, and for which key."""

    after: int
    reach: list[int] | None
    names: dict[int, str] = field(default_factory=dict)
    key: ApiPrincipal | None = None  # None: nobody to check again (a cursor made by hand)
    # The datasets of ``reach`` as they were at the start: id -> created_at.
    born: dict[int, Any] = field(default_factory=dict)


def open_cursor(key: ApiPrincipal, *, dataset: str | None, after: int | None) -> EventCursor:
    """A cursor after ``after`` (None: from now on; 0: from the oldest event kept)."""
    reach: list[int] | None
    with Session(reads.ctx().engine) as session:
        if dataset:
            ds = queries.dataset_by_name(session=session, name=dataset)
            if ds is None or not key.reaches(ds.id):
                raise Missing(f"no dataset named {dataset!r}")
            reach = [ds.id]
        else:
            reach = key.reach
        born: dict[int, Any] = {}
        if reach is not None:
            rows = session.exec(select(Dataset).where(col(Dataset.id).in_(reach))).all()
            born = {d.id: as_utc(d.created_at) for d in rows}
            reach = sorted(
                born
            )  # a dataset already gone is not reached (nor one with its id later)
        last = api_queries.last_event_id(session=session)
        start = last if after is None else max(0, min(after, MAX_ID))
        names = queries.dataset_names(session=session)
        return EventCursor(start, reach, names, key=key, born=born)


def check_reach(session: Session, cursor: EventCursor) -> None:
    """Raise StreamEnded when the cursor's key is no longer live, or all its datasets are gone;
    drop the datasets that went (or whose id is another dataset's now) from its reach."""
    key = cursor.key
    if key is None:
        return
    row = api_keys.key_by_lookup(session=session, lookup=key.lookup) if key.lookup else None
    if row is None or row.id != key.id or row.revoked_at is not None:
        raise StreamEnded("the key was revoked")
    if cursor.reach is None:
        return
    rows = session.exec(select(Dataset).where(col(Dataset.id).in_(cursor.reach))).all()
    now = {d.id: as_utc(d.created_at) for d in rows}
    kept = [i for i in cursor.reach if i in now and now[i] == cursor.born.get(i)]
    if not kept:
        raise StreamEnded(
            "the dataset was deleted" if len(cursor.born) == 1 else "its datasets were deleted"
        )
    cursor.reach = kept


def _settled_upto(session: Session, after: int) -> int:
    """The highest id up to which every event that will ever exist is visible now."""
    rows = session.exec(
        select(JobEvent.id, JobEvent.at)
        .where(JobEvent.id > after)
        .order_by(col(JobEvent.id))
        .limit(BATCH)
    ).all()
    if not rows:
        return after
    settled_before = db_now(session) - timedelta(seconds=GAP_WAIT_SECONDS)
    upto = after
    for event_id, at in rows:
        if event_id != upto + 1 and as_utc(at) > settled_before:
            break  # a gap below a recent event: an insert that may still commit
        upto = event_id
    return upto


def _data(e: JobEvent, job: Job, names: dict[int, str]) -> dict[str, Any]:
    return {
        "event_id": e.id,
        "type": EVENT_TYPES[e.kind],
        "kind": e.kind,
        "at": as_utc(e.at).isoformat(),
        "actor": e.actor,
        "message": e.message,
        "job": {
            "id": job.id,
            "document_id": job.document_id,
            "dataset": names.get(job.dataset_id, ""),
            "filename": job.filename,
            "status": e.to_status or job.status.value,
            "stage": e.stage,
            "attempt": e.attempt,
            "max_attempts": job.max_attempts,
        },
    }


def poll(cursor: EventCursor) -> list[StreamEvent]:
    """The events after the cursor that are settled, of its datasets; moves the cursor past them
    (and past the events of other datasets in between). StreamEnded when it may deliver no more."""
    with Session(reads.ctx().engine) as session:
        check_reach(session, cursor)
        upto = _settled_upto(session, cursor.after)
        if upto == cursor.after:
            return []
        rows = api_queries.events_between(
            session=session,
            after_id=cursor.after,
            upto_id=upto,
            kinds=tuple(EVENT_TYPES),
            dataset_ids=cursor.reach,
        )
        if any(j.dataset_id not in cursor.names for _, j in rows):
            cursor.names = queries.dataset_names(session=session)
    cursor.after = upto
    return [
        StreamEvent(int(e.id or 0), EVENT_TYPES[e.kind], _data(e, j, cursor.names)) for e, j in rows
    ]
