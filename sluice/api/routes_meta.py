"""What needs no key: ``/v1/health`` and the API reference page (``/openapi.json`` is FastAPI's).

``/v1/health`` answers 200 while the process answers (what a liveness check and the suite wait
for), and says in ``ready`` whether the warm-up the lifespan started has finished
(``sluice.ops.health.warm_up``): a balancer that waits for ``ready`` sends no request that would
pay for a cold process."""

from __future__ import annotations

import threading
from importlib.metadata import PackageNotFoundError, version

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from pydantic import ConfigDict, Field

from sluice.api import examples, reference
from sluice.api.schemas import Health

router = APIRouter()
warmed = threading.Event()  # set by the server's warm-up once it finished


class HealthOut(Health):
    model_config = ConfigDict(json_schema_extra={"examples": [examples.HEALTH]})
    ready: bool = Field(
        description="the process finished its warm-up: the first request costs no more than later "
        "ones (false for a moment after a start)"
    )


def package_version() -> str:
    try:
        return version("sluice")
    except PackageNotFoundError:
        return "unknown"


@router.get("/v1/health", response_model=HealthOut, tags=["meta"])
def health() -> dict:
    """The API process answers (no key needed); ``ready`` once it has warmed up."""
    return {"status": "ok", "version": package_version(), "ready": warmed.is_set()}


@router.get("/reference", response_class=HTMLResponse, include_in_schema=False)
def reference_page() -> HTMLResponse:
    return HTMLResponse(reference.PAGE)


@router.get("/reference.js", include_in_schema=False)
def reference_script() -> Response:
    return Response(reference.SCRIPT, media_type="text/javascript")


@router.get("/reference.css", include_in_schema=False)
def reference_style() -> Response:
    return Response(reference.STYLE, media_type="text/css")


@router.get("/", include_in_schema=False)
def root() -> RedirectResponse:
    return RedirectResponse("/reference")
