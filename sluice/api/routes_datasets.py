"""``/v1/datasets``: the key's datasets with their counts; making one (a manage key of every
dataset)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from sluice.api.dependencies import Key
from sluice.api.problems import Problem
from sluice.api.replay import idempotent
from sluice.api.schemas import DatasetCreate, DatasetCreated, DatasetList, DatasetOut, problems
from sluice.ops import scoped

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
