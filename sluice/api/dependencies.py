"""The key of a request, as a dependency: ``key: Key`` in a route's signature makes the route need
one (401 without a live key), counts the request against the key's rate (429), and records the key
on the request so the idempotency layer and the event stream can use it."""

from __future__ import annotations

import math
from dataclasses import replace
from functools import lru_cache
from typing import Annotated

from fastapi import Depends, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from sluice.api.authentication import authenticate, record_refusal
from sluice.api.problems import Problem
from sluice.api.rate_limit import RateLimiter
from sluice.ops.keys import ApiPrincipal
from sluice.settings import get_settings

bearer = HTTPBearer(
    auto_error=False,
    description="An API key made by `sluice keys create`: `Authorization: Bearer sluice_...`",
)


@lru_cache(maxsize=1)
def limiter() -> RateLimiter:
    return RateLimiter(get_settings().api_rate_per_minute)


def current_key(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Security(bearer)],
) -> ApiPrincipal:
    key = authenticate(credentials.credentials if credentials else None)
    address = request.client.host if request.client else ""
    if key is None:
        if credentials:  # a token that is no live key: the audit log says who tried, from where
            record_refusal(credentials.credentials, address)
        raise Problem(
            401,
            "unauthorized",
            "a live API key is needed: Authorization: Bearer <key> (sluice keys create)",
            headers={"WWW-Authenticate": 'Bearer realm="sluice"'},
        )
    wait = limiter().take(key.id)
    if wait:
        raise Problem(
            429,
            "rate_limited",
            f"key {key.name!r} made {limiter().per_minute} requests in the last minute "
            "(SLUICE_API_RATE_PER_MINUTE)",
            headers={"Retry-After": str(max(1, math.ceil(wait)))},
        )
    key = replace(key, address=address)
    request.state.key = key
    return key


Key = Annotated[ApiPrincipal, Depends(current_key)]
