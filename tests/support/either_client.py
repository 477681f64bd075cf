"""The Python client's tests run one tour for both clients: each call of a sync client's method
is a value, each of an async client's an awaitable; these make them the same to the tour."""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import AsyncIterator
from typing import Any

from sluice.client import AsyncClient, Client


def words(subject: str, n: int = 60) -> str:
    """A text of ``n`` sentences about ``subject``: several chunks, found by its word."""
    return " ".join(f"{subject} section {i} of the {subject} notes." for i in range(n))


async def v(value: Any) -> Any:
    """The value of a sync client's call, or the awaited one of an async client's."""
    return await value if inspect.isawaitable(value) else value


async def collect(found: Any, until: Any = None) -> list[Any]:
    """The items of a sync or async iterator, up to the first for which ``until`` holds."""
    got: list[Any] = []
    if hasattr(found, "__aiter__"):
        try:
            async for item in found:
                got.append(item)
                if until is not None and until(got):
                    break
        finally:
            await found.aclose()
        return got
    for item in found:
        got.append(item)
        if until is not None and until(got):
            break
    found.close()
    return got


@contextlib.asynccontextmanager
async def opened(kind: str, url: str, token: str, **options: Any) -> AsyncIterator[Any]:
    """A ``Client`` (kind "sync") or an ``AsyncClient``, closed at the end."""
    if kind == "sync":
        with Client(url, token, **options) as client:
            yield client
    else:
        async with AsyncClient(url, token, **options) as client:
            yield client
