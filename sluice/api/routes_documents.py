"""``/v1/documents/{id}``: a document with its jobs, the chunks search serves for it (in order,
paged), and deleting it (a manage key)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse, Response

from sluice.api.dependencies import Key
from sluice.api.problems import Problem
from sluice.api.schemas import ChunkPage, DeleteOut, DocumentId, DocumentOut, problems
from sluice.ops import scoped

router = APIRouter(prefix="/v1/documents", tags=["documents"])


@router.get("/{document_id}", response_model=DocumentOut, responses=problems(401, 404, 429))
def get_document(document_id: DocumentId, key: Key) -> dict:
    return scoped.document(key, document_id)


@router.get("/{document_id}/chunks", response_model=ChunkPage, responses=problems(401, 404, 429))
def get_chunks(
    document_id: DocumentId,
    key: Key,
    offset: Annotated[int, Query(ge=0, le=10_000_000)] = 0,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> dict:
    rows = scoped.chunks(key, document_id, offset=offset, limit=limit + 1)
    more = len(rows) > limit
    return {
        "chunks": rows[:limit],
        "offset": offset,
        "limit": limit,
        "next_offset": offset + limit if more else None,
    }


@router.delete(
    "/{document_id}", response_model=DeleteOut, responses=problems(401, 403, 404, 409, 429)
)
def delete_document(document_id: DocumentId, key: Key) -> Response:
    done = scoped.delete_document(key, document_id)
    if not done.ok:
        raise Problem(409, "action_refused", done.message)
    return JSONResponse(
        {
            "ok": True,
            "message": done.message,
            "vectors_removed": done.vectors_removed,
            "blob_removed": done.blob_removed,
            "jobs_deleted": done.jobs_deleted,
        }
    )
