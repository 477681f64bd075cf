"""``/v1/sources``: the S3 prefixes and folders datasets follow (manage keys, within their
datasets): list, add an S3 source (its first sync waits for ``confirm``), remove one, and sync
one now or preview what a sync would do.
A folder source is a path on the server's host: it is added there (``sluice sources add``). A
refusal (``SourceError``, the operator check's) answers by its own status, code and hint
(``sluice.api.problems``)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field
from pydantic.dataclasses import dataclass

from sluice.api import examples, sources
from sluice.api.dependencies import Key
from sluice.api.problems import Problem
from sluice.api.replay import idempotent
from sluice.api.schemas import Strict, problems
from sluice.ops.sources.syncing import SourceView

router = APIRouter(prefix="/v1/sources", tags=["sources"])


@dataclass(
    config=ConfigDict(
        json_schema_serialization_defaults_required=True,
        json_schema_extra={"examples": [examples.SOURCE]},
    )
)
class SourceOut(SourceView):  # the fields of a SourceView, in the schema of the answers
    pass


class SourceList(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [examples.SOURCE_LIST]})
    sources: list[SourceOut]


class SourceCreate(Strict):
    model_config = ConfigDict(json_schema_extra={"examples": [examples.SOURCE_CREATE]})
    name: str = Field(min_length=1, max_length=64, examples=["team-share"])
    dataset: str = Field(min_length=1, max_length=64, examples=["default"])
    s3: str = Field(min_length=6, max_length=1000, examples=["s3://bucket/team/"])
    include: list[str] = Field(default_factory=list, max_length=50)
    exclude: list[str] = Field(default_factory=list, max_length=50)
    every: str | None = Field(default=None, max_length=20, examples=["15m"])


class SyncRequest(Strict):
    model_config = ConfigDict(json_schema_extra={"examples": [examples.SYNC_REQUEST]})
    preview: bool = False
    confirm: bool = False


class SyncOut(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [examples.SYNC]})
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


class SourceRemoved(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [examples.SOURCE_REMOVED]})
    ok: bool
    message: str
    deleted: int  # documents the source made, deleted
    kept: int  # documents the source made, kept (``keep_documents``)
    adopted: int  # documents that were in the dataset before the source: released, not deleted


@router.get("", response_model=SourceList, responses=problems(401, 403, 429))
def list_sources(key: Key) -> dict:
    return {"sources": [v.to_dict() for v in sources.key_sources(key)]}


@router.post(
    "", status_code=201, response_model=SourceOut, responses=problems(401, 403, 404, 409, 422, 429)
)
def create_source(body: SourceCreate, request: Request, key: Key) -> Response:
    def answer() -> Response:
        view = sources.key_add(key, **body.model_dump())
        return JSONResponse(view.to_dict(), status_code=201)

    return idempotent(request, key, [body.model_dump()], answer)


@router.get("/{name}", response_model=SourceOut, responses=problems(401, 403, 404, 429))
def get_source(name: str, key: Key) -> dict:
    return sources.key_source(key, name).to_dict()


@router.delete("/{name}", response_model=SourceRemoved, responses=problems(401, 403, 404, 409, 429))
def delete_source(name: str, key: Key, keep_documents: bool = False) -> dict:
    """Forget the source: the documents it made are deleted (unless ``keep_documents``), those
    that were in the dataset before it are released. 409 ``sync_running`` while a sync of it
    runs."""
    done = sources.key_remove(key, name, keep_documents=keep_documents)
    return {
        "ok": True,
        "message": done.message,
        "deleted": done.deleted,
        "kept": done.kept,
        "adopted": done.adopted,
    }


@router.post(
    "/{name}/sync", response_model=SyncOut, responses=problems(401, 403, 404, 409, 422, 429)
)
def sync_source(name: str, body: SyncRequest, request: Request, key: Key) -> Response:
    """Sync now (``confirm`` lets through removals the guard holds, and runs a new source's first
    sync: without it that answers ``status`` ``unconfirmed`` and the plan, nothing done), or
    ``preview`` only: the plan's counts and its cost in chunks to embed. 409 while another sync of
    it runs."""

    def answer() -> Response:
        result = sources.key_sync(key, name, preview=body.preview, confirm=body.confirm)
        if result.status == "busy":
            raise Problem(409, "sync_running", result.message)
        return JSONResponse(result.to_dict())

    return idempotent(request, key, [name, body.model_dump()], answer)
