"""``/v1/documents/{id}``: a document with its jobs, the chunks search serves for it (in order,
paged), and deleting it (a manage key)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse, Response

from sluice.api import scoped
from sluice.api.dependencies import Key
from sluice.api.problems import Problem
from sluice.api.schemas import (
    ChunkPage,
    DeleteOut,
    DocumentId,
    DocumentList,
    DocumentOut,
    problems,
)
from sluice.ops import replacing
from sluice.ops.documents import DeleteResult
from sluice.ops.replacing import EXTERNAL_ID_PATTERN

router = APIRouter(prefix="/v1/documents", tags=["documents"])


@router.get("", response_model=DocumentList, responses=problems(401, 404, 422, 429))
def documents_by_external_id(
    key: Key,
    external_id: Annotated[
        str, Query(min_length=1, max_length=512, json_schema_extra={"pattern": EXTERNAL_ID_PATTERN})
    ],
    dataset: Annotated[str | None, Query(max_length=64)] = None,
) -> dict:
    """The live document the application calls ``external_id``, in each dataset in reach (or in
    ``dataset``): ``{"documents": [...]}``, empty when there is none."""
    check_external_id(external_id)
    return {"documents": scoped.documents_by_external_id(key, external_id, dataset)}


def check_external_id(external_id: str) -> None:
    """``replacing.check_external_id`` for the API: a 422 ``bad_external_id`` naming the fault."""
    try:
        replacing.check_external_id(external_id)
    except replacing.BadExternalId as err:  # the API's detail states the rule too, not only hint
        raise Problem(err.status, err.code, f"{err}. {err.hint}", hint=err.hint) from None


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
    return deleted(scoped.delete_document(key, document_id))


def deleted(done: DeleteResult) -> Response:
    """A delete's answer: what it removed, or 409 with the refusal in the console's words."""
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
