"""Document metadata and chunks switched off: ``PATCH /v1/documents/{id}`` (replace the metadata),
``GET /v1/datasets/{dataset}/documents`` (listed, filtered by ``where``) and
``PATCH /v1/chunks/{chunk_id}`` (``enabled``)."""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, Field

from sluice.api import scoped
from sluice.api.dependencies import Key
from sluice.api.problems import Problem
from sluice.api.schemas import DocumentId, DocumentOut, Strict, problems
from sluice.ops import metadata as meta

router = APIRouter(tags=["documents"])
ChunkId = Annotated[str, Path(min_length=1, max_length=120, description="a chunk id")]


class MetadataIn(Strict):
    metadata: dict[str, Any] = Field(
        description="the document's new metadata, in full: keys left out are removed",
        examples=[{"lang": "de", "team": ["a", "b"]}],
    )


class ChunkIn(Strict):
    enabled: bool = Field(description="false: kept in the index, left out of every search")


class ChunkStateOut(BaseModel):
    chunk_id: str
    dataset_id: int
    document_id: int
    enabled: bool


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


def parse_where_param(value: str | None) -> dict | None:
    """A ``where`` query parameter (JSON text) as a checked filter (FilterError: a 422 problem)."""
    if value is None or not value.strip():
        return None
    try:
        where = json.loads(value)
    except ValueError:
        raise Problem(422, "invalid_filter", "where: not JSON", key="") from None
    meta.parse_where(where)
    return where


@router.patch(
    "/v1/documents/{document_id}",
    response_model=DocumentOut,
    responses=problems(401, 403, 404, 422, 429),
)
async def patch_document(document_id: DocumentId, body: MetadataIn, key: Key) -> dict:
    """Replace the document's metadata (the whole object: a key left out is removed). Search sees
    the change at once for every chunk of the document; nothing is embedded again."""
    return await run_in_threadpool(scoped.set_document_metadata, key, document_id, body.metadata)


@router.get(
    "/v1/datasets/{dataset}/documents",
    response_model=DocumentListPage,
    responses=problems(401, 404, 422, 429),
)
def list_documents(
    dataset: Annotated[str, Path(min_length=1, max_length=64)],
    key: Key,
    where: Annotated[
        str | None, Query(max_length=8192, description="a metadata filter, as JSON")
    ] = None,
    offset: Annotated[int, Query(ge=0, le=10_000_000)] = 0,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> dict:
    """The dataset's live documents, oldest first, those a ``where`` filter allows."""
    rows = scoped.list_documents(
        key, dataset, where=parse_where_param(where), offset=offset, limit=limit + 1
    )
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
    responses=problems(401, 403, 404, 409, 422, 429),
)
async def patch_chunk(chunk_id: ChunkId, body: ChunkIn, key: Key) -> dict:
    """Switch a chunk off (kept in the index, shown as disabled, left out of every search) or on
    again."""
    state = await run_in_threadpool(scoped.set_chunk_enabled, key, chunk_id, body.enabled)
    return state.to_dict()
