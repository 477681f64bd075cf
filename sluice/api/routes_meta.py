"""What needs no key: ``/v1/health`` and the API reference page (``/openapi.json`` is FastAPI's)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from sluice.api import reference
from sluice.api.schemas import Health

router = APIRouter()


def package_version() -> str:
    try:
        return version("sluice")
    except PackageNotFoundError:
        return "unknown"


@router.get("/v1/health", response_model=Health, tags=["meta"])
def health() -> dict:
    """The API process answers (no key needed)."""
    return {"status": "ok", "version": package_version()}


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
