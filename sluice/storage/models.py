"""SQLModel tables: datasets, documents, jobs, their events, the outbox and webhook deliveries.

The job database is the source of truth for every job; Redis only carries job ids.
"""

from __future__ import annotations

from datetime import UTC, datetime
from enum import Enum
from typing import Any

from sqlalchemy import JSON, Column, Index, Text, UniqueConstraint, text
from sqlmodel import Field, SQLModel

from sluice.errors import ErrorKind
from sluice.storage.audit_log import AuditEntry  # noqa: F401  (its table is made with these)
from sluice.storage.chunk_edits import ChunkEdit  # noqa: F401  (its table is made with these)
from sluice.storage.hit_tests import HitTestQuery  # noqa: F401  (its table is made with these)
from sluice.storage.reconcile_checkpoints import (  # noqa: F401  (its table is made with these)
    ReconcileCheckpoint,
)
from sluice.storage.source_records import (  # noqa: F401  (their tables are made with these)
    Source,
    SourceEntry,
    SourceLease,
    SourceRun,
)
from sluice.storage.tallies import Tally, TallyDelta  # noqa: F401  (their tables are made with these)

MAX_ID = 2**31 - 1  # ids are INTEGER columns (PostgreSQL's int4): a larger one names nothing


def utcnow() -> datetime:
    return datetime.now(UTC)


class JobStatus(str, Enum):
    pending = "pending"
    running = "running"
    retrying = "retrying"
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"
    superseded = "superseded"  # a newer pipeline version of the document took over search
    deleted = "deleted"

    @classmethod
    def active(cls) -> tuple[JobStatus, ...]:
        return (cls.pending, cls.running, cls.retrying)

    @classmethod
    def final(cls) -> tuple[JobStatus, ...]:
        return (cls.succeeded, cls.failed, cls.cancelled, cls.superseded, cls.deleted)


class Stage(str, Enum):
    queued = "queued"
    parsing = "parsing"
    ocr = "ocr"  # parsing, on a page that OCR reads (done = that page, total = the page count)
    chunking = "chunking"
    embedding = "embedding"
    indexing = "indexing"
    done = "done"


STAGE_UNITS = {
    Stage.parsing: "pages",
    Stage.ocr: "pages",
    Stage.chunking: "pages",
    Stage.embedding: "chunks",
    Stage.indexing: "chunks",
}


class Instance(SQLModel, table=True):
    """One row, made with the database: the id of this Sluice instance. Queue messages carry it, so
    a worker of another instance on the same queue (its own job database) knows a message is not
    its."""

    id: int = Field(default=1, primary_key=True)
    instance_id: str = Field(max_length=40, unique=True)
    created_at: datetime = Field(default_factory=utcnow)
    # The reapers' shared clock: when one last found the database answering, and, after a silence
    # (the database down, or no worker at all), the time before which no running job is taken back.
    reaper_tick_at: datetime | None = None
    reap_after: datetime | None = None


class Dataset(SQLModel, table=True):
    # The ids are typed int: a stored row always has one (None only before its first flush).
    id: int = Field(default=None, primary_key=True)
    name: str = Field(index=True, unique=True, max_length=64)
    description: str = ""
    # Chroma collection of this dataset; unique per row so instances can share one Chroma server.
    collection: str = Field(unique=True, max_length=80)
    created_at: datetime = Field(default_factory=utcnow)
    priority: int | None = (
        None  # its jobs' priority when they have none of their own (higher first; None = 0)
    )
    # What this dataset sets for itself instead of the process's settings
    # (sluice.storage.dataset_settings).
    parse_settings: dict[str, Any] | None = Field(
        default=None, sa_column=Column(JSON, nullable=True)
    )
    settings_changed_at: datetime | None = None
    settings_changed_by: str | None = Field(default=None, max_length=120)
    # Set when a delete of the dataset began (sluice.ops.dataset_admin): from then on it takes no
    # upload and answers no search, and a rerun of the delete or recovery finishes it.
    deleting_at: datetime | None = None


LIVE_EXTERNAL = (
    "external_id IS NOT NULL AND deleted_at IS NULL AND replaced_by IS NULL"
    " AND (replaces_document_id IS NULL OR active_job_id IS NOT NULL)"
)


class Document(SQLModel, table=True):
    __table_args__ = (
        UniqueConstraint("dataset_id", "sha256", name="uq_document_dataset_sha"),
        # The versions of one external id in a dataset (sluice.storage.replacements), and at most
        # one live document per external id, even for uploads at the same moment.
        Index("ix_document_dataset_external", "dataset_id", "external_id"),
        Index(
            "uq_document_live_external",
            "dataset_id",
            "external_id",
            unique=True,
            sqlite_where=text(LIVE_EXTERNAL),
            postgresql_where=text(LIVE_EXTERNAL),
        ),
    )

    id: int = Field(default=None, primary_key=True)
    dataset_id: int = Field(foreign_key="dataset.id", index=True)
    sha256: str = Field(max_length=64, index=True)
    size: int
    media_type: str = Field(max_length=100)
    filename: str = Field(max_length=255)
    blob_key: str = Field(max_length=80)
    created_at: datetime = Field(default_factory=utcnow)
    # The job whose chunks search serves for this document (switches only when a new job succeeds).
    active_job_id: int | None = Field(default=None, index=True)
    deleted_at: datetime | None = None
    # The application's own id of the document (unique per dataset among live documents). New bytes
    # under it are a new version (``doc_version`` 1, 2, ...): a candidate that ``replaces`` the one
    # serving until its job succeeds; then the old one is deleted and names its ``replaced_by``.
    external_id: str | None = Field(default=None, max_length=512)
    doc_version: int | None = None
    replaces_document_id: int | None = None
    replaced_by: int | None = None
    # The application's own fields (sluice.ops.metadata validates them); search filters on these,
    # read here, so one UPDATE of this row changes what every chunk of the document answers to.
    metadata_: dict[str, Any] | None = Field(
        default=None, sa_column=Column("metadata", JSON, nullable=True)
    )
    # Switched off (sluice.ops.document_switch): kept in both stores, answered by no search. Search
    # reads it with ``active_job_id`` in one statement, so one UPDATE hides or shows the whole
    # document; a new version by external id takes it over when it starts serving.
    disabled_at: datetime | None = None
    disabled_by: str | None = Field(default=None, max_length=120)
    # The newest chunk edit of the document (sluice.storage.chunk_edits): written with each edit,
    # and compared by a job's success, which refuses when an edit landed since its run read them.
    last_edit_id: int | None = None


class DisabledChunk(SQLModel, table=True):
    """A chunk switched off (sluice.ops.chunks): kept in both stores, left out of every search.
    Its id is the chunk id of the stores, so the switch holds for every job writing that chunk."""

    __tablename__ = "disabled_chunk"
    __table_args__ = (UniqueConstraint("dataset_id", "chunk_id", name="uq_disabled_chunk"),)

    id: int = Field(default=None, primary_key=True)
    # no foreign key: a dataset's delete removes its rows in steps, and this row must not block it
    dataset_id: int = Field(index=True)
    chunk_id: str = Field(max_length=120)
    document_id: int = Field(index=True)
    disabled_at: datetime = Field(default_factory=utcnow)
    disabled_by: str = Field(default="system", max_length=120)


class Job(SQLModel, table=True):
    __table_args__ = (
        Index("ix_job_dataset_status_created", "dataset_id", "status", "created_at"),
        Index("ix_job_status_created", "status", "created_at"),
        Index("ix_job_status_heartbeat", "status", "heartbeat_at"),
        Index("ix_job_dataset_created", "dataset_id", "created_at"),
        Index("ix_job_error_kind_status", "error_kind", "status"),
        Index("ix_job_stage_status", "stage", "status"),
        Index("ix_job_finished", "finished_at"),
        # The overview's throughput and drain rate: jobs finished since a time, with their chunk
        # counts (covering: a day of jobs is counted from the index alone).
        Index("ix_job_status_finished", "status", "finished_at", "chunk_count"),
        # Sorted pages of the jobs table (ORDER BY created_at/updated_at, id) walk these, even deep
        # ones.
        Index("ix_job_created_id", "created_at", "id"),
        Index("ix_job_updated_id", "updated_at", "id"),
        # The few jobs with a priority of their own ("run next"), which the dispatcher ranks apart.
        Index("ix_job_priority", "priority"),
    )

    id: int = Field(default=None, primary_key=True)
    document_id: int = Field(foreign_key="document.id", index=True)
    dataset_id: int = Field(foreign_key="dataset.id")
    filename: str = Field(max_length=255, index=True)
    idempotency_key: str = Field(max_length=200, unique=True)
    pipeline_version: str = Field(max_length=40)

    status: JobStatus = Field(default=JobStatus.pending, max_length=20)
    stage: Stage = Field(default=Stage.queued, max_length=20)
    done: int = 0
    total: int = 0

    attempt: int = 0  # attempts used of the current budget (reset by a manual retry)
    max_attempts: int = 5
    priority: int | None = None  # higher is published first; None = its dataset's priority
    lease: int = 0  # fencing token: bumped by every claim, never reset
    version: int = 0  # compare-and-set column: bumped by every update

    next_attempt_at: datetime | None = None
    heartbeat_at: datetime | None = None
    worker_id: str | None = Field(default=None, max_length=120)
    cancel_requested: bool = False
    dismissed: bool = False
    # A dependency outage (or no worker of its pipeline version): the job waits without spending
    # attempts. What it waits for, and since when (kept across rounds of the same outage).
    waiting_for: str | None = Field(default=None, max_length=200)
    waiting_since: datetime | None = None

    error_kind: ErrorKind | None = Field(default=None, max_length=30)
    error_code: str | None = Field(default=None, max_length=60)
    error_message: str | None = Field(default=None, sa_column=Column(Text))
    fix_hint: str | None = Field(default=None, sa_column=Column(Text))
    error_detail: str | None = Field(default=None, sa_column=Column(Text))

    page_count: int | None = None
    chunk_count: int | None = None
    embedded_count: int = 0  # chunks the model actually encoded in the last attempt
    cached_count: int = 0  # chunks served by the embedding cache in the last attempt

    created_at: datetime = Field(default_factory=utcnow)
    updated_at: datetime = Field(default_factory=utcnow)
    started_at: datetime | None = None
    finished_at: datetime | None = None


class JobEvent(SQLModel, table=True):
    __tablename__ = "job_event"

    id: int = Field(default=None, primary_key=True)
    job_id: int = Field(foreign_key="job.id", index=True)
    at: datetime = Field(default_factory=utcnow)
    kind: str = Field(max_length=40)
    from_status: str | None = Field(default=None, max_length=20)
    to_status: str | None = Field(default=None, max_length=20)
    stage: str | None = Field(default=None, max_length=20)
    attempt: int | None = None
    actor: str = Field(default="system", max_length=120)
    message: str = Field(default="", sa_column=Column(Text))
    data: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON))


class Pause(SQLModel, table=True):
    """A pause in force: of one dataset, or of the whole queue (``dataset_id`` None, ``scope``
    "all"). Its jobs are not claimed or published while the row exists; resuming deletes it."""

    id: int = Field(default=None, primary_key=True)
    scope: str = Field(max_length=40, unique=True)  # "all" or "dataset:<id>": one pause per scope
    dataset_id: int | None = Field(default=None, foreign_key="dataset.id", index=True)
    paused_by: str = Field(max_length=120)
    paused_at: datetime = Field(default_factory=utcnow)
    reason: str = Field(default="", sa_column=Column(Text))


class Outbox(SQLModel, table=True):
    __table_args__ = (
        Index("ix_outbox_pending", "sent_at", "available_at"),
        # The dispatcher's heads: a dataset's first unsent rows in order, read from the index
        # whatever the backlog (the datasets with unsent rows are read from it too).
        Index("ix_outbox_unsent_dataset", "sent_at", "dataset_id", "id"),
        # The messages on the queue (``in_flight``): a few rows, whatever the backlog.
        Index(
            "ix_outbox_in_flight",
            "in_flight",
            "job_id",
            sqlite_where=text("in_flight IS NOT NULL"),
            postgresql_where=text("in_flight IS NOT NULL"),
        ),
    )

    id: int = Field(default=None, primary_key=True)
    job_id: int = Field(foreign_key="job.id", index=True)
    # The job's dataset (a job never changes dataset), kept here for the index above. Rows written
    # before it existed are filled in when the schema is brought up to date (``db.init_schema``).
    dataset_id: int | None = None
    created_at: datetime = Field(default_factory=utcnow)
    available_at: datetime = Field(default_factory=utcnow)
    sent_at: datetime | None = None
    publish_attempts: int = 0
    last_error: str | None = Field(default=None, max_length=500)
    # True from the row's publish until a worker takes its message (the claim, whatever it
    # decides): the dispatcher counts the messages on the queue from these rows, not from every
    # waiting job. None otherwise (and in rows an older Sluice wrote).
    in_flight: bool | None = None


class WebhookDelivery(SQLModel, table=True):
    """One event for one endpoint, written in the transaction that ended the job (or the source's
    sync run), delivered later.

    ``job_id`` names the job of a job event, ``source_id`` the source of a ``source.synced`` one:
    an endpoint gets the events of one job, or of one source, in order. No foreign keys: the
    delivery log says what was sent even after retention removed the job (or the source was
    removed). ``next_attempt_at`` is also the claim: a dispatcher moves it past its own timeout
    before it posts, by compare-and-set, so two dispatchers never post one row at the same time.
    """

    __tablename__ = "webhook_delivery"
    __table_args__ = (
        Index("ix_webhook_due", "delivered_at", "gave_up_at", "next_attempt_at"),
        Index("ix_webhook_endpoint_created", "endpoint", "created_at"),
    )

    id: int = Field(default=None, primary_key=True)
    event_id: str = Field(max_length=40, index=True)  # the same for every endpoint of one event
    endpoint: str = Field(max_length=500)
    job_id: int | None = Field(default=None, index=True)
    source_id: int | None = Field(default=None, index=True)
    event: str = Field(max_length=40)
    body: str = Field(sa_column=Column(Text, nullable=False))
    created_at: datetime = Field(default_factory=utcnow)
    attempts: int = 0
    next_attempt_at: datetime = Field(default_factory=utcnow)
    last_status: int | None = None
    last_error: str | None = Field(default=None, max_length=500)
    delivered_at: datetime | None = None
    gave_up_at: datetime | None = None


class ApiKey(SQLModel, table=True):
    """A key of the HTTP API: what it may do (``scope``) and where (its datasets, or all of them).

    Only a hash of the secret is kept. ``lookup`` is the public part of the token that finds the
    row; the secret is then compared with the stored hash in constant time (sluice.ops.keys).
    """

    __tablename__ = "api_key"

    id: int = Field(default=None, primary_key=True)
    name: str = Field(max_length=64, unique=True)
    lookup: str = Field(max_length=32, unique=True)
    secret_hash: str = Field(max_length=64)
    scope: str = Field(max_length=20)  # read, ingest or manage
    all_datasets: bool = False
    dataset_ids: list[int] = Field(default_factory=list, sa_column=Column(JSON))
    created_at: datetime = Field(default_factory=utcnow)
    created_by: str = Field(default="", max_length=120)
    last_used_at: datetime | None = None
    revoked_at: datetime | None = None
    revoked_by: str | None = Field(default=None, max_length=120)


class IdempotencyRecord(SQLModel, table=True):
    """The first answer to a POST that carried an ``Idempotency-Key``, kept for 24 hours.

    One row per API key and idempotency key: a second request with the same pair finds it, and
    replays the answer (same request), refuses another body, or is told the first is in flight.
    """

    __tablename__ = "api_idempotency"
    __table_args__ = (
        UniqueConstraint("key_id", "idempotency_key", name="uq_api_idempotency_key"),
        Index("ix_api_idempotency_created", "created_at"),
    )

    id: int = Field(default=None, primary_key=True)
    key_id: int = Field(index=False)
    idempotency_key: str = Field(max_length=255)
    fingerprint: str = Field(max_length=64)  # sha256 of method, path and body
    status_code: int | None = None  # None while the first request is still in flight
    headers: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON))
    body: str | None = Field(default=None, sa_column=Column(Text))
    created_at: datetime = Field(default_factory=utcnow)
    completed_at: datetime | None = None
    # the API process answering it while in flight: host, pid and the pid's start time
    owner: str | None = Field(default=None, max_length=300)
