"""``/v1/datasets``: the key's datasets with their counts; making one (a manage key of every
dataset); renaming and deleting one (a manage key of that dataset, sluice.ops.dataset_admin)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from sluice.api import examples, scoped
from sluice.api.dependencies import Key
from sluice.api.problems import Problem
from sluice.api.replay import idempotent
from sluice.api.schemas import (
    DatasetCreate,
    DatasetCreated,
    DatasetList,
    DatasetOut,
    Strict,
    problems,
)
from sluice.ops import dataset_admin
from sluice.pipeline.running.context import get_context

# dataset_admin's refusals as problem+json statuses
STATUS = {
    "unknown_dataset": 404,
    "invalid_dataset_name": 422,
    "dataset_name_taken": 409,
    "dataset_deleting": 409,
    "jobs_still_running": 409,
    "read_only": 403,
}

router = APIRouter(prefix="/v1/datasets", tags=["datasets"])


@router.get("", response_model=DatasetList, responses=problems(401, 429))
def list_datasets(key: Key) -> dict:
    return {"datasets": scoped.datasets(key)}


@router.post(
    "",
    status_code=201,
    response_model=DatasetCreated,
    responses=problems(401, 403, 409, 422, 429),
)
def create_dataset(body: DatasetCreate, request: Request, key: Key) -> Response:
    def answer() -> Response:
        ok, message = scoped.create_dataset(key, body.name)
        if not ok:
            raise Problem(422, "invalid_dataset_name", message)
        created = {
            "ok": True,
            "message": message,
            "dataset": scoped.dataset(key, body.name.strip()),
        }
        return JSONResponse(created, status_code=201)

    return idempotent(request, key, [body.model_dump()], answer)


@router.get("/{dataset}", response_model=DatasetOut, responses=problems(401, 404, 429))
def get_dataset(dataset: str, key: Key) -> dict:
    return scoped.dataset(key, dataset)


class DatasetRename(Strict):
    model_config = ConfigDict(json_schema_extra={"examples": [examples.DATASET_RENAME]})
    name: str = Field(min_length=1, max_length=64, examples=["contracts-2024"])


class DatasetRenamed(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [examples.DATASET_RENAMED]})
    ok: bool
    message: str
    dataset: DatasetOut


class DatasetDeleted(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [examples.DATASET_DELETED]})
    ok: bool
    message: str


def _refused(result: dataset_admin.AdminResult) -> Problem:
    return Problem(STATUS.get(result.code, 409), result.code or "refused", result.message)


@router.patch(
    "/{dataset}",
    response_model=DatasetRenamed,
    responses=problems(401, 403, 404, 409, 422, 429),
)
def rename_dataset(dataset: str, body: DatasetRename, key: Key) -> dict:
    """A new name for the dataset: its documents, jobs, search and the API keys that reach it are
    the same (keys name datasets by id)."""
    scoped.dataset(key, dataset)  # 404 for a dataset the key does not reach
    scoped.require(key, "manage", "renaming a dataset")
    # discreet: a name another dataset has is refused in the same words whether this key reaches
    # that dataset or not (nothing tells a key that a dataset it cannot see is there)
    result = dataset_admin.rename(get_context(), key.operator, dataset, body.name, discreet=True)
    if not result.ok:
        raise _refused(result)
    return {
        "ok": True,
        "message": result.message,
        "dataset": scoped.dataset(key, body.name.strip()),
    }


@router.delete(
    "/{dataset}",
    response_model=DatasetDeleted,
    responses=problems(401, 403, 404, 409, 429),
)
def delete_dataset(dataset: str, key: Key) -> dict:
    """Delete the dataset and everything in it: its jobs are cancelled, its documents, chunks and
    unshared files removed. 409 ``jobs_still_running`` when a running job has not stopped in time:
    the dataset is already closed to uploads and search; send the DELETE again."""
    scoped.dataset(key, dataset)
    scoped.require(key, "manage", "deleting a dataset")
    result = dataset_admin.delete(get_context(), key.operator, dataset)
    if not result.ok:
        raise _refused(result)
    return {"ok": True, "message": result.message}
