"""Every error of the API as RFC 9457 ``application/problem+json``: ``type``, ``title``, ``status``,
``detail`` and a stable ``code``; also the routing's 404 and 405 and the validation errors. Every
``OperationError`` (sluice.errors) answers here, in one handler, by its own status, code and hint
(and the ``members`` and ``headers`` it carries): no route translates one by hand. No input gives a
500: an unexpected exception is one answer with no details (the log has them)."""

from __future__ import annotations

import json
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from sluice.errors import OperationError

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
    503: "Service unavailable",
}
CODES = {404: "not_found", 405: "method_not_allowed", 400: "bad_request", 406: "not_acceptable"}


class Problem(OperationError):
    """An answer that is an error, made in a route (its status and code are the route's own);
    raise it anywhere in a route. ``extra`` are more members of the body."""

    def __init__(
        self,
        status: int,
        code: str,
        detail: str,
        *,
        headers: dict[str, str] | None = None,
        hint: str | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(detail, code=code, hint=hint)
        self.status, self.detail = status, detail
        self.headers = headers or {}
        self.members = extra

    def response(self) -> Response:
        return answer(self)


def answer(exc: OperationError) -> Response:
    """An OperationError as problem+json: its status and code, its message as ``detail``, its
    ``hint`` (when it has one), and the ``members`` and ``headers`` it carries."""
    members = dict(exc.members)
    if exc.hint:
        members.setdefault("hint", exc.hint)
    headers = dict(exc.headers) or None
    return problem_response(exc.status, exc.code, str(exc), headers=headers, **members)


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
    @app.exception_handler(OperationError)
    async def _refused(_: Request, exc: OperationError) -> Response:
        return answer(exc)

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
