"""Every error of the API as RFC 9457 ``application/problem+json``: ``type``, ``title``, ``status``,
``detail`` and a stable ``code``; also the routing's 404 and 405 and the validation errors. No input
gives a 500: an unexpected exception is one answer with no details (the log has them)."""

from __future__ import annotations

import json
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from sluice.api.idempotency import BadIdempotencyKey, KeyReused, StillInFlight
from sluice.api.scoped import Missing, ScopeMissing
from sluice.ops.keys import KeyRefused

log = logging.getLogger(__name__)

MEDIA_TYPE = "application/problem+json"
TITLES = {
    400: "Bad request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not found",
    405: "Method not allowed",
    406: "Not acceptable",
    409: "Conflict",
    413: "Content too large",
    415: "Unsupported media type",
    422: "Unprocessable content",
    429: "Too many requests",
    500: "Internal server error",
}
CODES = {404: "not_found", 405: "method_not_allowed", 400: "bad_request", 406: "not_acceptable"}


class Problem(Exception):
    """An answer that is an error; raise it anywhere in a route."""

    def __init__(
        self,
        status: int,
        code: str,
        detail: str,
        *,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(detail)
        self.status, self.code, self.detail = status, code, detail
        self.headers = headers or {}
        self.extra = extra

    def response(self) -> Response:
        return problem_response(
            self.status, self.code, self.detail, headers=self.headers, **self.extra
        )


def problem_body(status: int, code: str, detail: str, **extra: Any) -> dict[str, Any]:
    return {
        "type": f"urn:sluice:problem:{code}",
        "title": TITLES.get(status, "Error"),
        "status": status,
        "detail": detail,
        "code": code,
        **extra,
    }


def problem_response(
    status: int, code: str, detail: str, *, headers: dict[str, str] | None = None, **extra: Any
) -> Response:
    body = json.dumps(problem_body(status, code, detail, **extra), separators=(",", ":"))
    return Response(body, status_code=status, media_type=MEDIA_TYPE, headers=headers)


def _validation(errors: list[Any]) -> list[dict[str, Any]]:
    """Where and what, never the value sent (it may be a password)."""
    return [
        {
            "loc": [str(p) for p in e.get("loc", ())],
            "msg": str(e.get("msg", "")),
            "type": e.get("type"),
        }
        for e in errors
    ]


def install(app: FastAPI) -> None:
    @app.exception_handler(Problem)
    async def _problem(_: Request, exc: Problem) -> Response:
        return exc.response()

    @app.exception_handler(Missing)
    async def _missing(_: Request, exc: Missing) -> Response:
        return problem_response(404, "not_found", str(exc))

    @app.exception_handler(ScopeMissing)
    async def _scope(_: Request, exc: ScopeMissing) -> Response:
        return problem_response(403, "scope_missing", str(exc))

    @app.exception_handler(KeyRefused)
    async def _key_refused(_: Request, exc: KeyRefused) -> Response:
        return problem_response(422, "key_refused", str(exc))

    @app.exception_handler(BadIdempotencyKey)
    async def _bad_key(_: Request, exc: BadIdempotencyKey) -> Response:
        return problem_response(422, "bad_idempotency_key", str(exc))

    @app.exception_handler(KeyReused)
    async def _reused(_: Request, exc: KeyReused) -> Response:
        return problem_response(422, "idempotency_key_reused", str(exc))

    @app.exception_handler(StillInFlight)
    async def _in_flight(_: Request, exc: StillInFlight) -> Response:
        return problem_response(
            409, "idempotency_in_flight", str(exc), headers={"Retry-After": "1"}
        )

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> Response:
        errors = _validation(list(exc.errors()))
        where = "; ".join(f"{'.'.join(e['loc'])}: {e['msg']}" for e in errors[:5])
        return problem_response(422, "invalid_request", where or "invalid request", errors=errors)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> Response:
        status = exc.status_code
        detail = exc.detail if isinstance(exc.detail, str) else TITLES.get(status, "error")
        headers = dict(exc.headers or {})
        return problem_response(
            status, CODES.get(status, f"http_{status}"), detail, headers=headers
        )

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> Response:
        log.exception("unexpected error answering %s %s", request.method, request.url.path)
        return problem_response(500, "internal_error", "the server failed; the log says why")
