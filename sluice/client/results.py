"""The API's answers as typed results: one dataclass per response schema of ``/openapi.json``
(``sluice/api/schemas.py`` and the routes' response models), field for field.

A result also answers ``result["name"]`` and ``result.get("name")`` as the dict it was made from
does (the client's answers were dicts before), ``raw`` is the answer as it came, and a field the
server did not send is None (an older server), a field it sent that this client does not know is
kept in ``raw`` (a newer one). ``tests/test_client_types.py`` fails when a schema's field is
missing here.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass
from typing import Any, TypeVar

R = TypeVar("R", bound="Result")
C = TypeVar("C")


@typing.dataclass_transform(frozen_default=True, kw_only_default=True, eq_default=False)
def result(cls: type[C]) -> type[C]:
    """A result class: a frozen dataclass of keyword fields, equal by ``Result.__eq__``."""
    return dataclass(frozen=True, kw_only=True, eq=False)(cls)


@dataclass(frozen=True, kw_only=True, eq=False)
class Result:
    """The base of every answer: built by ``from_dict``, read by attribute or by key."""

    @classmethod
    def from_dict(cls: type[R], data: dict[str, Any]) -> R:
        hints = field_types(cls)
        values = {
            f.name: convert(hints[f.name], data[f.name])
            for f in dataclasses.fields(cls)
            if f.name in data
        }
        missing = {
            f.name: None
            for f in dataclasses.fields(cls)
            if f.name not in data
            and f.default is dataclasses.MISSING
            and f.default_factory is dataclasses.MISSING
        }
        made = cls(**values, **missing)
        object.__setattr__(made, "_raw", data)
        return made

    @property
    def raw(self) -> dict[str, Any]:
        """The answer as the API sent it (also the fields this client does not know)."""
        return getattr(self, "_raw", None) or dataclasses.asdict(self)

    def __eq__(self, other: object) -> bool:
        """Equal to a result of its class with equal fields, and to the answer as a dict."""
        if isinstance(other, dict):
            return self.raw == other
        if type(other) is not type(self):
            return NotImplemented
        return dataclasses.astuple(self) == dataclasses.astuple(other)

    def __getitem__(self, name: str) -> Any:
        if name in field_types(type(self)):
            return getattr(self, name)
        return self.raw[name]

    def get(self, name: str, default: Any = None) -> Any:
        try:
            return self[name]
        except KeyError:
            return default

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and (name in field_types(type(self)) or name in self.raw)

    def keys(self) -> list[str]:
        return list(dict.fromkeys([*field_types(type(self)), *self.raw]))


_FIELD_TYPES: dict[type, dict[str, Any]] = {}


def field_types(cls: type) -> dict[str, Any]:
    """The resolved type of each field of a result class (worked out once per class)."""
    found = _FIELD_TYPES.get(cls)
    if found is None:
        hints = typing.get_type_hints(cls)
        found = _FIELD_TYPES[cls] = {f.name: hints[f.name] for f in dataclasses.fields(cls)}
    return found


def convert(hint: Any, value: Any) -> Any:
    """``value`` (JSON) as ``hint`` says: results, lists of results, optional ones; else as is."""
    if value is None:
        return None
    if isinstance(hint, type) and issubclass(hint, Result) and isinstance(value, dict):
        return hint.from_dict(value)
    origin = typing.get_origin(hint)
    if origin is list and isinstance(value, list):
        (item,) = typing.get_args(hint) or (Any,)
        return [convert(item, v) for v in value]
    if origin in (types.UnionType, typing.Union):
        for arm in typing.get_args(hint):
            if arm is not type(None):
                return convert(arm, value)
    return value


# --- meta and datasets ----------------------------------------------------------------------------


@result
class Health(Result):
    """``GET /v1/health`` (HealthOut): the process answers; ``ready`` once it warmed up."""

    status: str
    version: str
    ready: bool


@result
class Dataset(Result):
    """A dataset the key reaches, with its counts (DatasetOut); ``jobs``: job counts by status."""

    name: str
    documents: int
    chunks: int
    jobs: dict[str, int]
    created_at: str


@result
class DatasetCreated(Result):
    ok: bool
    message: str
    dataset: Dataset


@result
class DatasetRenamed(Result):
    ok: bool
    message: str
    dataset: Dataset


@result
class DatasetDeleted(Result):
    ok: bool
    message: str


# --- uploads and jobs -----------------------------------------------------------------------------


@result
class UploadedJob(Result):
    """One file of an upload (UploadedJob): its job, its document; ``existing``: the same bytes
    were there already (this is their job)."""

    job_id: int
    document_id: int
    filename: str
    status: str
    existing: bool
    external_id: str | None = None
    version: int | None = None
    replaces_document_id: int | None = None
    metadata_changed: bool = False  # the same bytes, whose metadata this upload replaced


@result
class Waiting(Result):
    """Why a job that is not running waits (Waiting): paused, queue_unreachable, no_worker,
    outage, backoff or queue; what it waits for, and what its start estimate stands on."""

    reason: str
    detail: str
    waiting_for: str | None = None
    starts_at: str | None = None
    ahead: int | None = None
    basis: str | None = None


@result
class Job(Result):
    """A job's state (JobOut): status, stage and counts (``progress``: "embedding 32/120
    chunks"), why it waits, and for a dead letter its error and fix."""

    id: int
    dataset: str
    document_id: int
    filename: str
    status: str
    stage: str
    done: int
    total: int
    progress: str
    attempt: int
    max_attempts: int
    final: bool
    waiting: Waiting | None
    waiting_for: str | None
    waiting_since: str | None
    error_kind: str | None
    error_code: str | None
    error_message: str | None
    fix_hint: str | None
    cancel_requested: bool
    chunk_count: int | None
    page_count: int | None
    pipeline_version: str
    created_at: str | None
    updated_at: str | None
    finished_at: str | None
    next_attempt_at: str | None
    heartbeat_at: str | None
    version_message: str | None = None


@result
class JobPage(Result):
    """One page of ``GET /v1/jobs`` (JobList); ``next_cursor`` asks for the next."""

    jobs: list[Job]
    next_cursor: str | None


@result
class ActionResult(Result):
    """What a retry, cancel or unlock did (ActionOut), in the console's words, and the job after."""

    ok: bool
    message: str
    queue_note: str = ""
    warnings: list[str] = dataclasses.field(default_factory=list)
    job: Job


# --- documents and chunks -------------------------------------------------------------------------


@result
class DocumentJob(Result):
    id: int
    status: str
    pipeline_version: str
    chunk_count: int | None


@result
class Document(Result):
    """A document with its jobs (DocumentOut); under an external id, how its versions stand."""

    id: int
    dataset: str
    filename: str
    sha256: str
    size: int
    media_type: str
    created_at: str
    deleted: bool
    active_job_id: int | None
    chunk_count: int
    page_count: int | None
    jobs: list[DocumentJob]
    metadata: dict[str, Any] = dataclasses.field(default_factory=dict)
    external_id: str | None = None
    version: int | None = None
    version_state: str = ""
    version_message: str = ""
    replaces_document_id: int | None = None
    replaced_by: int | None = None
    serving_document_id: int | None = None
    serving_version: int | None = None
    enabled: bool = True  # false: switched off, kept, left out of every search
    disabled_at: str | None = None
    disabled_by: str | None = None


@result
class ListedDocument(Result):
    """A live document of a dataset's listing (ListedDocument)."""

    id: int
    filename: str
    media_type: str
    size: int
    created_at: str
    active_job_id: int | None
    metadata: dict[str, Any]


@result
class DocumentPage(Result):
    """One page of a dataset's documents (DocumentListPage); ``next_offset`` asks for the next."""

    documents: list[ListedDocument]
    offset: int
    limit: int
    next_offset: int | None


@result
class Chunk(Result):
    """A chunk search serves for a document (ChunkOut); ``enabled`` false: switched off."""

    chunk_id: str
    position: int
    page: int
    text: str
    enabled: bool = True


@result
class ChunkPage(Result):
    chunks: list[Chunk]
    offset: int
    limit: int
    next_offset: int | None


@result
class ChunkState(Result):
    """A chunk after its switch or edit (ChunkStateOut)."""

    chunk_id: str
    dataset: str
    document_id: int
    enabled: bool
    text: str | None = None
    edited: bool | None = None


@result
class Deleted(Result):
    """What deleting a document removed (DeleteOut)."""

    ok: bool
    message: str
    vectors_removed: int
    blob_removed: bool
    jobs_deleted: list[int]


# --- search ---------------------------------------------------------------------------------------


@result
class Hit(Result):
    """One chunk a search found (HitOut); ``location``: its place in words (page, section),
    ``where`` its old name."""

    score: float
    text: str
    snippet: str
    document_id: int
    chunk_id: str
    job_id: int
    filename: str
    page: int
    where: str
    matched: list[str]
    ocr: bool
    similarity: float | None
    heading: str = ""  # the chunk's heading path: "Title > Section" ("" for none)
    location: str = ""  # its place in words: the page, or the section
    rerank_score: float | None = None  # the reranker's 0..1 score, when one reranked the hits
    context: str | None = None  # its section's text around it (the dataset's context_size)


# --- audit ----------------------------------------------------------------------------------------


@result
class AuditEntry(Result):
    """One row of the audit log (AuditRow): who changed what, when, from where, and how it ended."""

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


@result
class AuditPage(Result):
    """One page of the audit log (AuditList), newest first; ``next_cursor`` asks for older rows."""

    entries: list[AuditEntry]
    next_cursor: str | None


# --- sources --------------------------------------------------------------------------------------


@result
class Source(Result):
    """A source a dataset follows (SourceOut): where, how often, its last run; a new one is not
    ``confirmed`` until a sync with ``confirm=True``."""

    name: str
    dataset: str
    kind: str
    location: str
    include: list[str]
    exclude: list[str]
    every_seconds: int | None
    next_run_at: str | None
    documents: int = 0
    tombstoned: int = 0
    last_run: dict[str, Any] | None
    state: str = "confirmed"
    confirmed: bool = True
    preview: dict[str, Any] | None


@result
class SyncResult(Result):
    """A sync or its preview (SyncOut): the plan's counts, its cost, and what was done."""

    source: str
    ran: bool
    preview: bool
    status: str
    run_id: int | None
    counts: dict[str, int]
    failed: list[dict[str, str]]
    held_reason: str
    cost: str
    to_embed: int
    message: str
    seconds: float


@result
class SourceRemoved(Result):
    """A source forgotten (SourceRemoved): documents it made deleted, kept, or released."""

    ok: bool
    message: str
    deleted: int
    kept: int
    adopted: int


@result
class Problem(Result):
    """An error's body (ProblemOut, ``application/problem+json``): carried by ``ApiError``."""

    type: str
    title: str
    status: int
    detail: str
    code: str
    hint: str | None = None
