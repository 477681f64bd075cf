"""Document metadata and switches: ``PATCH /v1/documents/{id}`` (replace the metadata, switch the
whole document off or on), ``GET /v1/datasets/{dataset}/documents`` (listed, filtered by
``where``) and ``PATCH /v1/chunks/{chunk_id}`` (``enabled``, ``text``)."""

from __future__ import annotations

from dataclasses import replace
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, Field, model_validator

from sluice.api import scoped
from sluice.api.dependencies import Key
from sluice.api.schemas import (
    METADATA_SCHEMA,
    DocumentId,
    DocumentOut,
    Strict,
    problems,
    where_parameter,
)
from sluice.ops import metadata as meta
from sluice.ops import reads
from sluice.ops.chunks import MAX_CHUNK_TEXT

router = APIRouter(tags=["documents"])
ChunkId = Annotated[str, Path(min_length=1, max_length=120, description="a chunk id")]


class DocumentPatchIn(Strict):
    """What to change of a document: its metadata, its switch, or both (at least one)."""

    metadata: dict[str, Any] | None = Field(
        None,
        json_schema_extra={
            **METADATA_SCHEMA,
            "description": "the document's new metadata, in full: keys left out are removed; "
            + METADATA_SCHEMA["description"],
        },
    )
    enabled: bool | None = Field(
        None,
        description="false: the whole document is switched off (its chunks kept in the index, "
        "none answered by any search); true: on again",
    )

    @model_validator(mode="after")
    def _something(self) -> DocumentPatchIn:
        if self.metadata is None and self.enabled is None:
            raise ValueError("name metadata, enabled, or both")
        return self


class ChunkIn(Strict):
    """What to change of a chunk: its switch, its text, or both (at least one)."""

    enabled: bool | None = Field(
        None, description="false: kept in the index, left out of every search; true: on again"
    )
    text: str | None = Field(
        None,
        min_length=1,
        max_length=MAX_CHUNK_TEXT,
        description="the chunk's new text, embedded and indexed again under the same id; kept "
        "across reindexes and retries (it replaces the text the pipeline makes for this chunk). "
        "The pipeline's own text again undoes the edit.",
    )

    @model_validator(mode="after")
    def _something(self) -> ChunkIn:
        if self.enabled is None and self.text is None:
            raise ValueError("name enabled, text, or both")
        return self


class ChunkStateOut(BaseModel):
    chunk_id: str
    dataset: str = Field(description="the chunk's dataset, by name as every other answer names it")
    document_id: int
    enabled: bool
    text: str | None = Field(None, description="with an edit: the chunk's text now")
    edited: bool | None = Field(
        None, description="with an edit: whether the text differs from what the pipeline made"
    )


class ListedDocument(BaseModel):
    id: int
    filename: str
    media_type: str
    size: int
    created_at: str
    active_job_id: int | None
    metadata: dict[str, Any]


class DocumentListPage(BaseModel):
    documents: list[ListedDocument]
    offset: int
    limit: int
    next_offset: int | None


MAX_WHERE_CHARS = 8192


def parse_where_param(value: str | None) -> dict | None:
    """A ``where`` query parameter (JSON text) as a checked filter (FilterError: a 422 problem;
    also for text too long, or too deep for the JSON reader)."""
    if value is None or not value.strip():
        return None
    if len(value) > MAX_WHERE_CHARS:
        raise meta.FilterError("", f"{len(value)} characters; at most {MAX_WHERE_CHARS}")
    where = meta.loads(value, meta.FilterError)
    meta.parse_where(where)
    return where


def where_query(request: Request) -> dict | None:
    """The ``where`` query parameter, checked: a dependency, because /openapi.json declares it
    itself (``where_parameter``: JSON content of a WhereFilter; FastAPI's Query cannot say so)."""
    return parse_where_param(request.query_params.get("where"))


Where = Annotated[dict | None, Depends(where_query)]


@router.patch(
    "/v1/documents/{document_id}",
    response_model=DocumentOut,
    responses=problems(401, 403, 404, 422, 429),
)
async def patch_document(document_id: DocumentId, body: DocumentPatchIn, key: Key) -> dict:
    """Replace the document's metadata (the whole object: a key left out is removed) and/or switch
    the whole document off or on (``enabled``; kept in both stores, left out of every search).
    Search sees either change at once for every chunk of the document; nothing is embedded again."""
    out: dict = {}
    if body.metadata is not None:
        out = await run_in_threadpool(scoped.set_document_metadata, key, document_id, body.metadata)
    if body.enabled is not None:
        out = await run_in_threadpool(scoped.set_document_enabled, key, document_id, body.enabled)
    return out


@router.get(
    "/v1/datasets/{dataset}/documents",
    response_model=DocumentListPage,
    responses=problems(401, 404, 422, 429),
    openapi_extra={"parameters": [where_parameter("only the documents this filter allows")]},
)
def list_documents(
    dataset: Annotated[str, Path(min_length=1, max_length=64)],
    key: Key,
    where: Where,
    offset: Annotated[int, Query(ge=0, le=10_000_000)] = 0,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> dict:
    """The dataset's live documents, oldest first, those a ``where`` filter allows."""
    rows = scoped.list_documents(key, dataset, where=where, offset=offset, limit=limit + 1)
    more = len(rows) > limit
    return {
        "documents": rows[:limit],
        "offset": offset,
        "limit": limit,
        "next_offset": offset + limit if more else None,
    }


@router.patch(
    "/v1/chunks/{chunk_id}",
    response_model=ChunkStateOut,
    responses=problems(401, 403, 404, 409, 422, 429, 503),
)
async def patch_chunk(chunk_id: ChunkId, body: ChunkIn, key: Key) -> dict:
    """Switch a chunk off (kept in the index, shown as disabled, left out of every search) or on
    again; give it new text (embedded and indexed again at once, kept across reindexes)."""
    state = None
    if body.text is not None:
        state = await run_in_threadpool(scoped.edit_chunk, key, chunk_id, body.text)
    if body.enabled is not None:
        switched = await run_in_threadpool(scoped.set_chunk_enabled, key, chunk_id, body.enabled)
        state = switched if state is None else replace(state, enabled=switched.enabled)
    assert state is not None  # the body names one or both
    names = {d.id: d.name for d in await run_in_threadpool(reads.datasets)}
    out = state.to_dict()
    return {**out, "dataset": names.get(out.pop("dataset_id"), "")}
