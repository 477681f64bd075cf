"""The FastAPI application, and ``sluice serve api`` (uvicorn on
SLUICE_API_ADDRESS:SLUICE_API_PORT)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from sluice.api import (
    problems,
    routes_audit,
    routes_datasets,
    routes_documents,
    routes_events,
    routes_jobs,
    routes_meta,
    routes_metadata,
    routes_search,
    routes_sources,
    routes_uploads,
)
from sluice.api.guard import Guard
from sluice.api.routes_meta import package_version
from sluice.api.schemas import TextUpload

log = logging.getLogger(__name__)


@asynccontextmanager
async def _lifespan(_app: FastAPI) -> AsyncIterator[None]:
    yield
    # On the way out: the refused calls this process counted and had not written yet
    # (``audit_trail.refused_once_per`` writes a flood's count once a second).
    from sluice.ops import audit_trail

    try:
        audit_trail.flush_refusals()
    except Exception:  # the job database is gone too: nothing more to do on the way out
        log.exception("could not write the count of refused API calls at shutdown")


def create_app() -> FastAPI:
    app = FastAPI(
        lifespan=_lifespan,
        title="Sluice API",
        version=package_version(),
        description="Push documents, poll their jobs, follow the event stream, search.",
        docs_url=None,
        redoc_url=None,
        openapi_url="/openapi.json",
    )
    for module in (
        routes_meta,
        routes_datasets,
        routes_uploads,
        routes_jobs,
        routes_documents,
        routes_metadata,
        routes_search,
        routes_events,
        routes_audit,
        routes_sources,
    ):
        app.include_router(module.router)
    problems.install(app)
    app.add_middleware(Guard)
    app.openapi = _openapi(app)  # type: ignore[method-assign]
    return app


PROBLEM_REF = {"$ref": "#/components/schemas/ProblemOut"}


def _openapi(app: FastAPI):
    """FastAPI's document, with every error answer as what it is: problem+json, and a default one
    (whatever an operation answers beyond its listed statuses is a problem too)."""

    def build() -> dict:
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title, version=app.version, description=app.description, routes=app.routes
            )
            problem = {"application/problem+json": {"schema": PROBLEM_REF}}
            for item in schema["paths"].values():
                for op in item.values():
                    responses = op.setdefault("responses", {})
                    for status, answer in responses.items():
                        if status.isdigit() and int(status) >= 400:
                            answer["content"] = problem
                            answer["description"] = problems.TITLES.get(int(status), "Error")
                    responses["default"] = {"description": "an error", "content": problem}
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            components["TextUpload"] = TextUpload.model_json_schema()
            components.pop("HTTPValidationError", None)
            components.pop("ValidationError", None)
            app.openapi_schema = schema
        return app.openapi_schema

    return build


app = create_app()
