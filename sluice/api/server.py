"""The FastAPI application, and ``sluice serve api`` (uvicorn on
SLUICE_API_ADDRESS:SLUICE_API_PORT).

Its lifespan starts the warm-up (a thread: ``/v1/health`` says ``ready`` once it finished) and
the outbox dispatcher (a thread that puts uploaded jobs on the queue: ``sluice.api.dispatcher``),
and makes the event that ends every open event stream when the process is told to stop: uvicorn
waits for open requests before it runs the lifespan's shutdown, so a stream would hold the stop
for as long as it lasts; the lifespan therefore listens to SIGINT and SIGTERM itself (before
uvicorn's own handler, which it then calls), and every stream ends at once with a last comment."""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from sluice.api import (
    documenting,
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
from sluice.api.dependencies import KeyGate
from sluice.api.dispatcher import dispatcher
from sluice.api.guard import Guard
from sluice.api.routes_events import streams
from sluice.api.routes_meta import package_version, warmed
from sluice.api.schemas import TextUpload
from sluice.ops import health

log = logging.getLogger(__name__)
WARM_RETRY_SECONDS = 5.0
WARM_JOIN_SECONDS = 5.0
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _warm(stop: threading.Event) -> None:
    """The warm-up thread: ``health.warm_up`` until it succeeds (each failure logged, with its
    traceback), then ``warmed``; gives up when the process stops."""
    while not stop.is_set():
        try:
            health.warm_up()
        except Exception:
            log.exception("the API's warm-up failed; trying again in %.0f s", WARM_RETRY_SECONDS)
            stop.wait(WARM_RETRY_SECONDS)
            continue
        warmed.set()
        return


def _listen_for_stop(closing: asyncio.Event) -> Callable[[], None]:
    """On SIGINT or SIGTERM: set ``closing`` (on the loop), then the handler there was (uvicorn's,
    which starts its shutdown). Returns what puts the handlers back. Only the main thread may set
    signal handlers: elsewhere (the app in a test's thread) this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    loop = asyncio.get_running_loop()
    before: dict[int, Any] = {}

    def on_signal(sig: int, frame: Any) -> None:
        loop.call_soon_threadsafe(closing.set)
        previous = before.get(sig)
        if callable(previous):
            previous(sig, frame)
        elif sig == signal.SIGINT:
            raise KeyboardInterrupt

    for sig in STOP_SIGNALS:
        before[sig] = signal.getsignal(sig)
        signal.signal(sig, on_signal)

    def restore() -> None:
        for sig, previous in before.items():
            if signal.getsignal(sig) is on_signal:
                signal.signal(sig, previous)

    return restore


@asynccontextmanager
async def _lifespan(_app: FastAPI) -> AsyncIterator[None]:
    closing = asyncio.Event()
    streams.closing = closing
    restore = _listen_for_stop(closing)
    warmed.clear()
    stop_warming = threading.Event()
    # A daemon: a warm-up stuck on a dead service must not hold the process's exit (it logs what
    # fails; the shutdown waits a few seconds for it, then lets it go).
    warming = threading.Thread(
        target=_warm, args=(stop_warming,), name="sluice-warm-up", daemon=True
    )
    warming.start()
    dispatcher.start()
    try:
        yield
    finally:
        closing.set()
        restore()
        stop_warming.set()
        await asyncio.to_thread(warming.join, WARM_JOIN_SECONDS)
        await asyncio.to_thread(dispatcher.stop)
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
    modules = (
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
    )
    for module in modules:
        app.include_router(module.router)
    problems.install(app)
    # inside the Guard: the key before any body is read (the routes as included: no prefix)
    app.add_middleware(KeyGate, routes=[r for m in modules for r in m.router.routes])
    app.add_middleware(Guard)
    app.openapi = _openapi(app)  # type: ignore[method-assign]
    return app


PROBLEM_REF = {"$ref": "#/components/schemas/ProblemOut"}


def _openapi(app: FastAPI):
    """FastAPI's document, with every error answer as what it is: problem+json (with the codes it
    may carry), and a default one (whatever an operation answers beyond its listed statuses is a
    problem too); and the examples the models cannot carry (sluice.api.documenting)."""

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
            documenting.decorate(schema)
            app.openapi_schema = schema
        return app.openapi_schema

    return build


app = create_app()
