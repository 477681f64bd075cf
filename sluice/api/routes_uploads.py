"""``POST /v1/datasets/{dataset}/documents``: store the files and answer 202 with their jobs at once
(nothing slow happens in the request: the workers parse, chunk, embed and index, and the process's
dispatcher thread puts the jobs on the queue after the answer); and
``DELETE /v1/datasets/{dataset}/documents/by-external-id/{external_id}``."""

from __future__ import annotations

from typing import Annotated, Any, BinaryIO, cast

from fastapi import APIRouter, Request
from fastapi import Path as FastApiPath
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response

from sluice.api import examples, scoped
from sluice.api.dependencies import Key
from sluice.api.dispatcher import dispatcher
from sluice.api.problems import Problem
from sluice.api.replay import idempotent
from sluice.api.routes_documents import check_external_id, deleted
from sluice.api.schemas import (
    EXTERNAL_ID_SCHEMA,
    METADATA_SCHEMA,
    DeleteOut,
    UploadAccepted,
    problems,
)
from sluice.api.uploads import Part, read_upload
from sluice.ops.ingest import SNIFF_BYTES, IngestResult
from sluice.ops.keys import ApiPrincipal
from sluice.settings import get_settings

router = APIRouter(tags=["documents"])
RETRY_AFTER_SECONDS = 2
OUTAGE_RETRY_SECONDS = 15
REFUSAL_STATUS = {
    "too_large": 413,
    "unsupported_type": 415,
    "blob_store_unavailable": 503,  # the object store does not answer: nothing was stored
    "blob_store_auth_failed": 503,
    "external_id_conflict": 409,
    "not_found": 404,  # the key's dataset was deleted while the upload came in
}

BODY = {
    "required": True,
    "content": {
        "multipart/form-data": {
            "schema": {
                "type": "object",
                "properties": {
                    "file": {"type": "array", "items": {"type": "string", "format": "binary"}},
                    "external_id": {"type": "string", **EXTERNAL_ID_SCHEMA},
                    "metadata": {
                        "type": "string",
                        "description": "the documents' metadata, a JSON object (docs/api.md)",
                        "contentMediaType": "application/json",
                        "contentSchema": {
                            k: v for k, v in METADATA_SCHEMA.items() if k != "examples"
                        },
                    },
                },
                "required": ["file"],
            },
            "example": examples.MULTIPART_UPLOAD,
        },
        "application/json": {"schema": {"$ref": "#/components/schemas/TextUpload"}},
    },
}


def _refused(result: IngestResult, accepted: list[dict]) -> Problem:
    status = REFUSAL_STATUS.get(result.error_code or "", 422)
    detail = f"{result.filename}: {result.message}" + (
        f". {result.fix_hint}" if result.fix_hint else ""
    )
    extra: dict[str, Any] = {"jobs": accepted} if accepted else {}
    # an outage of the object store: nothing was stored; the same request again, after a round
    headers = {"Retry-After": str(OUTAGE_RETRY_SECONDS)} if status == 503 else None
    return Problem(status, result.error_code or "refused", detail, headers=headers, **extra)


def _check_external_id(parts: list[Part]) -> None:
    external = parts[0].external_id if parts else None
    if external is None:
        return
    if len(parts) > 1:
        raise Problem(422, "external_id_needs_one_file", "an external_id names one file: send one")
    check_external_id(external)


def _ingest(key: ApiPrincipal, dataset: str, dataset_id: int, parts: list[Part]) -> Response:
    _check_external_id(parts)
    for part in parts:  # every file is judged by its bytes before any is stored
        refusal = scoped.type_refusal(
            part.file.read(SNIFF_BYTES), part.filename, part.declared_type
        )
        part.file.seek(0)
        if refusal is not None:
            raise _refused(refusal, [])
    accepted: list[dict] = []
    for part in parts:
        stream = cast(BinaryIO, part.file)  # a spooled temporary file: binary
        result = scoped.upload(
            key,
            dataset=dataset,
            dataset_id=dataset_id,
            filename=part.filename,
            stream=stream,
            external_id=part.external_id,
            metadata=part.metadata,
            declared_type=part.declared_type,
            dispatch=dispatcher.wake,
        )
        if not result.accepted or result.job_id is None or result.document_id is None:
            raise _refused(result, accepted)
        accepted.append(
            {
                "job_id": result.job_id,
                "document_id": result.document_id,
                "filename": result.filename,
                "status": result.status,
                "existing": result.duplicate,
                "external_id": result.external_id,
                "version": result.version,
                "replaces_document_id": result.replaces_document_id,
                "metadata_changed": result.metadata_changed,
            }
        )
    headers = {"Retry-After": str(RETRY_AFTER_SECONDS)}
    if len(accepted) == 1:
        headers["Location"] = f"/v1/jobs/{accepted[0]['job_id']}"
    return JSONResponse({"jobs": accepted}, status_code=202, headers=headers)


@router.post(
    "/v1/datasets/{dataset}/documents",
    status_code=202,
    response_model=UploadAccepted,
    responses=problems(401, 403, 404, 409, 413, 415, 422, 429, 503),
    openapi_extra={"requestBody": BODY},
)
async def upload(dataset: str, request: Request, key: Key) -> Response:
    """One or more files (multipart ``file`` parts), or ``{"filename", "text"}``. The same bytes
    already in the dataset answer with the existing job (``existing: true``). The dataset is
    resolved here, once: renamed while the body comes in, it still gets the files."""
    dataset_id = await run_in_threadpool(scoped.check_upload, key, dataset)
    parts = await read_upload(request, max_bytes=get_settings().max_upload_bytes)
    fingerprint = [
        dataset,
        *[[p.filename, p.sha256, *([p.external_id] if p.external_id else [])] for p in parts],
        *([{"metadata": parts[0].metadata}] if parts and parts[0].metadata is not None else []),
    ]
    try:
        return await run_in_threadpool(
            idempotent, request, key, fingerprint, lambda: _ingest(key, dataset, dataset_id, parts)
        )
    finally:
        for part in parts:
            part.file.close()


@router.delete(
    "/v1/datasets/{dataset}/documents/by-external-id/{external_id:path}",
    response_model=DeleteOut,
    responses=problems(401, 403, 404, 409, 422, 429),
)
def delete_by_external_id(
    dataset: str,
    external_id: Annotated[str, FastApiPath(json_schema_extra=EXTERNAL_ID_SCHEMA)],
    key: Key,
) -> Response:
    """Delete the document the application calls ``external_id`` in the dataset: the live version
    and a replacement still being built. 404 when the dataset has no such document."""
    _check_external_id([Part("", cast(BinaryIO, None), "", external_id)])
    return deleted(scoped.delete_by_external_id(key, dataset, external_id))
