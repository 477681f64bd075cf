"""``POST /v1/datasets/{dataset}/search``: the console's and the CLI's search, of one dataset."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response

from sluice.api import scoped
from sluice.api.dependencies import Key
from sluice.api.replay import idempotent
from sluice.api.schemas import SearchIn, SearchOut, problems
from sluice.ops import metadata as meta

router = APIRouter(tags=["search"])
FIELDS = (
    "score",
    "text",
    "snippet",
    "heading",
    "document_id",
    "chunk_id",
    "job_id",
    "filename",
    "page",
    "where",
    "matched",
    "ocr",
    "similarity",
    "rerank_score",
    "context",
)


def _hit(h) -> dict:
    """A hit as the API answers it (HitOut): ``location`` is its place, ``where`` the old name."""
    return {**{f: getattr(h, f) for f in FIELDS}, "location": h.where}


@router.post(
    "/v1/datasets/{dataset}/search",
    response_model=SearchOut,
    responses=problems(401, 404, 409, 422, 429, 503),
)
async def search(dataset: str, body: SearchIn, request: Request, key: Key) -> Response:
    # The filter is judged before anything else reads it (the idempotency fingerprint serialises
    # the body): a refusal is 422 invalid_filter, never a RecursionError of a deep one.
    where = body.where_filter()
    meta.parse_where(where)

    def answer() -> Response:
        # BadQuery, FilterError: 422 by their own codes (sluice.api.problems); a vector store that
        # does not answer: 503 vector_store_unavailable with Retry-After (sluice.ops.search)
        hits = scoped.search(
            key,
            dataset=dataset,
            query=body.query,
            k=body.k,
            mode=body.mode,
            filename=body.filename,
            pages=body.pages,
            media_type=body.media_type,
            where=where,
            min_score=body.min_score,
            max_chunks_per_document=body.max_chunks_per_document,
            dense_weight=body.dense_weight,
            rerank=body.rerank,
        )
        return JSONResponse({"hits": [_hit(h) for h in hits]})

    return await run_in_threadpool(idempotent, request, key, [dataset, body.model_dump()], answer)
