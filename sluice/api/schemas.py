"""The API's request and response models: the contract ``/openapi.json`` publishes."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import Path
from pydantic import BaseModel, ConfigDict, Field

from sluice.storage.models import MAX_ID

JobId = Annotated[int, Path(ge=1, le=MAX_ID, description="a job id")]
DocumentId = Annotated[int, Path(ge=1, le=MAX_ID, description="a document id")]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ProblemOut(BaseModel):
    type: str
    title: str
    status: int
    detail: str
    code: str
    hint: str | None = Field(None, description="what to do about it (docs/api.md, Errors)")


class Health(BaseModel):
    status: Literal["ok"]
    version: str


class DatasetOut(BaseModel):
    name: str
    documents: int
    chunks: int
    jobs: dict[str, int] = Field(description="job counts by status")
    created_at: str


class DatasetList(BaseModel):
    datasets: list[DatasetOut]


class DatasetCreate(Strict):
    name: str = Field(min_length=1, max_length=64, examples=["contracts"])


class DatasetCreated(BaseModel):
    ok: bool
    message: str
    dataset: DatasetOut


class TextUpload(Strict):
    filename: str = Field(min_length=1, max_length=255, examples=["note.txt"])
    text: str = Field(min_length=1)
    external_id: str | None = Field(
        None, description="the application's own id: new bytes under it replace the live version"
    )
    metadata: dict[str, Any] | None = Field(
        None,
        description="the document's own fields: keys ^[a-z][a-z0-9_]{0,63}$, values strings, "
        "numbers, booleans or lists of strings, at most 8 KB (docs/api.md, Metadata)",
        examples=[{"lang": "de", "year": 2024}],
    )


class UploadedJob(BaseModel):
    job_id: int
    document_id: int
    filename: str
    status: str
    existing: bool
    external_id: str | None = None
    version: int | None = None
    replaces_document_id: int | None = None


class UploadAccepted(BaseModel):
    jobs: list[UploadedJob]


class Waiting(BaseModel):
    reason: Literal["paused", "outage", "backoff", "queue"]
    detail: str
    starts_at: str | None = None
    ahead: int | None = None


class JobOut(BaseModel):
    id: int
    dataset: str
    document_id: int
    filename: str
    status: str
    stage: str
    done: int
    total: int
    progress: str = Field(description="the progress in words, e.g. 'embedding 320/500 chunks'")
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
    version_message: str | None = Field(
        None,
        description="under an external id: how its document's version stands",
        examples=["replacement failed; version 1 still serving"],
    )


class JobList(BaseModel):
    jobs: list[JobOut]
    next_cursor: str | None


class ActionOut(BaseModel):
    ok: bool
    message: str
    queue_note: str = ""
    warnings: list[str] = Field(default_factory=list)
    job: JobOut


class UnlockIn(Strict):
    password: str = Field(min_length=1, max_length=1024)


class DocumentJob(BaseModel):
    id: int
    status: str
    pipeline_version: str
    chunk_count: int | None


class DocumentOut(BaseModel):
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
    metadata: dict[str, Any] = Field(default_factory=dict)
    external_id: str | None = None
    version: int | None = None
    version_state: str = Field(
        "", description="serving, replacing, replacement_failed, replaced, superseded, deleted"
    )
    version_message: str = Field("", examples=["replacement failed; version 1 still serving"])
    replaces_document_id: int | None = None
    replaced_by: int | None = None
    serving_document_id: int | None = None
    serving_version: int | None = None


class DocumentList(BaseModel):
    documents: list[DocumentOut]


class ChunkOut(BaseModel):
    chunk_id: str
    position: int
    page: int
    text: str
    enabled: bool = True  # false: switched off (kept, left out of every search)


class ChunkPage(BaseModel):
    chunks: list[ChunkOut]
    offset: int
    limit: int
    next_offset: int | None


class DeleteOut(BaseModel):
    ok: bool
    message: str
    vectors_removed: int
    blob_removed: bool
    jobs_deleted: list[int]


class SearchIn(Strict):
    query: str = Field(min_length=1, max_length=2000, examples=["invoice 2024-117"])
    k: int = Field(5, ge=1, le=100)
    mode: Literal["hybrid", "dense", "lexical"] = "hybrid"
    filename: str | None = Field(None, max_length=255, description="file name contains this")
    pages: str | None = Field(None, max_length=40, description="A-B, A-, -B or one page")
    media_type: str | None = Field(None, max_length=100)
    where: dict[str, Any] | None = Field(
        None,
        description="a metadata filter in Chroma's style: $eq $ne $in $nin $gt $gte $lt $lte "
        "$exists, keys and $and combined with and (docs/api.md, Filters)",
        examples=[{"lang": "de", "year": {"$gte": 2020}}],
    )


class HitOut(BaseModel):
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


class SearchOut(BaseModel):
    hits: list[HitOut]


def problems(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The ``responses=`` of a route: these statuses answer problem+json."""
    return {s: {"model": ProblemOut} for s in statuses}
