"""The key of a request, as a dependency: ``key: Key`` in a route's signature makes the route need
one (401 without a live key), counts the request against the key's rate (429), and records the key
on the request so the idempotency layer and the event stream can use it.

``KeyGate`` runs the same check around the app, before FastAPI reads a byte of the body: a route
that needs a key answers 401 (or 429) to a request without one while its body is still unread, and
a route that takes a JSON body reads at most ``SLUICE_API_MAX_JSON_BYTES`` of it (413
``json_too_large`` beyond, at once for a ``Content-Length`` above it). An upload streams its body
itself, counted against ``SLUICE_MAX_UPLOAD_BYTES`` (sluice.api.uploads)."""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from dataclasses import replace
from functools import lru_cache
from typing import Annotated, Any

from fastapi import Depends, Request, Security
from fastapi.concurrency import run_in_threadpool
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.datastructures import Headers
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sluice.api.authentication import authenticate, record_refusal
from sluice.api.problems import Problem, answer, problem_response
from sluice.api.rate_limit import Budget, RateLimiter
from sluice.errors import OperationError
from sluice.ops.keys import ApiPrincipal
from sluice.settings import get_settings

log = logging.getLogger(__name__)

bearer = HTTPBearer(
    auto_error=False,
    description="An API key made by `sluice keys create`: `Authorization: Bearer sluice_...`",
)
CHECKED = "sluice_checked_key"  # the key KeyGate found, in the request's state


class JsonTooLarge(OperationError):
    """A JSON body larger than ``SLUICE_API_MAX_JSON_BYTES``: refused before it is read whole."""

    code, status = "json_too_large", 413
    hint = "Send a smaller body; files go as uploads (multipart), which have their own limit."


@lru_cache(maxsize=1)
def limiter() -> RateLimiter:
    return RateLimiter(get_settings().api_rate_per_minute)


def _token(authorization: str | None) -> str | None:
    """The bearer token of an ``Authorization`` header, as FastAPI's HTTPBearer reads it."""
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not token:
        return None
    return token


def check_key(token: str | None, address: str) -> ApiPrincipal:
    """The live key of ``token`` with the request's address, or Problem 401 (the refusal recorded
    in the audit log) or 429 (the key over its rate)."""
    return checked_key(token, address)[0]


def checked_key(token: str | None, address: str) -> tuple[ApiPrincipal, Budget]:
    """``check_key``, and what the request left of the key's budget (for the answer's fields)."""
    key = authenticate(token)
    if key is None:
        if token:  # a token that is no live key: the audit log says who tried, from where
            record_refusal(token, address)
        raise Problem(
            401,
            "unauthorized",
            "a live API key is needed: Authorization: Bearer <key> (sluice keys create)",
            headers={"WWW-Authenticate": 'Bearer realm="sluice"'},
        )
    budget = limiter().spend(key.id)
    if budget.wait:
        raise Problem(
            429,
            "rate_limited",
            f"key {key.name!r} made {limiter().per_minute} requests in the last minute "
            "(SLUICE_API_RATE_PER_MINUTE)",
            headers={"Retry-After": str(max(1, math.ceil(budget.wait))), **budget.headers()},
        )
    return replace(key, address=address), budget


def current_key(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Security(bearer)],
) -> ApiPrincipal:
    key = request.scope.get("state", {}).get(CHECKED)
    if not isinstance(key, ApiPrincipal):  # the app without its KeyGate: check here
        address = request.client.host if request.client else ""
        key = check_key(credentials.credentials if credentials else None, address)
    request.state.key = key
    return key


Key = Annotated[ApiPrincipal, Depends(current_key)]


def _needs_key(dependant: Any) -> bool:
    return any(d.call is current_key or _needs_key(d) for d in dependant.dependencies)


class KeyGate:
    """Around the app (inside the Guard): the key check and the JSON cap, before any body is read
    (see the module's docstring), for the ``routes`` given (the app's own, as included). Requests
    of no route, or of a route needing neither, pass."""

    def __init__(self, app: ASGIApp, routes: Iterable[Any] = ()) -> None:
        self.app = app
        # (route, needs a key, takes a JSON body), in the order the router tries them
        self._plans = [
            (r, _needs_key(r.dependant), r.body_field is not None)
            for r in routes
            if isinstance(r, APIRoute)
        ]

    def _plan(self, scope: Scope) -> tuple[bool, bool]:
        """(needs a key, takes a JSON body) of the route the request goes to."""
        for route, needs_key, json_body in self._plans:
            match, _ = route.matches(scope)
            if match == Match.FULL:
                return (needs_key, json_body)
        return (False, False)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        needs_key, json_body = self._plan(scope)
        headers = Headers(scope=scope)
        try:
            if needs_key:
                client = scope.get("client")
                address = client[0] if client else ""
                token = _token(headers.get("authorization"))
                key, budget = await run_in_threadpool(checked_key, token, address)
                scope.setdefault("state", {})[CHECKED] = key
                send = _with_headers(send, budget.headers())
            if json_body:
                receive = await _json_body(receive, headers, get_settings().api_max_json_bytes)
        except OperationError as exc:
            await answer(exc)(scope, receive, send)
            return
        except _Gone:
            return  # the client went before its body came: nobody to answer
        except Exception:  # the job database does not answer: as any route's unexpected error
            log.exception("unexpected error checking %s %s", scope["method"], scope["path"])
            body = problem_response(500, "internal_error", "the server failed; the log says why")
            await body(scope, receive, send)
            return
        await self.app(scope, receive, send)


class _Gone(Exception):
    pass


def _with_headers(send: Send, extra: dict[str, str]) -> Send:
    """``send`` that adds ``extra`` to the answer's head (a route's own value of one is kept)."""
    if not extra:
        return send
    encoded = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in extra.items()]

    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            present = {name.lower() for name, _ in message.get("headers", [])}
            added = [(k, v) for k, v in encoded if k not in present]
            message = {**message, "headers": [*message.get("headers", []), *added]}
        await send(message)

    return sending


def _too_large(limit: int) -> JsonTooLarge:
    return JsonTooLarge(
        f"the JSON body is larger than {limit:,} bytes (SLUICE_API_MAX_JSON_BYTES); "
        "it was refused unread"
    )


async def _json_body(receive: Receive, headers: Headers, limit: int) -> Receive:
    """A receive that gives the app the whole body (at most ``limit`` bytes, read here), then the
    client's own messages (its disconnect)."""
    declared = headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)  # refused before a byte of the body is read
    chunks: list[bytes] = []
    seen = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _Gone()
        body = message.get("body", b"")
        seen += len(body)
        if seen > limit:
            raise _too_large(limit)  # no more of it is read
        chunks.append(body)
        if not message.get("more_body", False):
            break
    whole: Message | None = {"type": "http.request", "body": b"".join(chunks), "more_body": False}

    async def replay() -> Message:
        nonlocal whole
        if whole is not None:
            message, whole = whole, None
            return message
        return await receive()

    return replay
