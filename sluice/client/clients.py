"""``Client`` and ``AsyncClient``: the same operations (``sluice.client.operations``), whose plans
each carries out over its own httpx client: one try of a request, a sleep, a stream read line by
line. Nothing else differs between them."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import httpx

from .operations import Operations
from .plans import Attempt, Call, Close, Done, Emit, Items, Open, ReadLine, Sleep, Stepper
from .retrying import Retry


def _headers(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}", "User-Agent": "sluice-client"}


class Client(Operations):
    """The API over a blocking httpx client.

    ``dataset``: the dataset of calls that name none (else the key's one dataset); ``retries``:
    when a request is tried again (``Retry``; ``Retry(attempts=1)``: never); ``clock`` and
    ``sleep``: the monotonic clock and the sleep its waits use (a test passes fake ones); other
    keywords go to ``httpx.Client`` (``verify=``, ``transport=``, ...)."""

    def __init__(
        self,
        url: str,
        key: str,
        *,
        dataset: str | None = None,
        timeout: float = 30.0,
        retries: Retry | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        **httpx_options: Any,
    ) -> None:
        super().__init__(dataset=dataset, retries=retries, clock=clock)
        self.sleep = sleep
        self.http = httpx.Client(
            base_url=url.rstrip("/"), headers=_headers(key), timeout=timeout, **httpx_options
        )

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        self.http.close()

    def bind_call(self, operation: Call[Any, Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            driver = _Driver(self, operation.plan(self, *args, **kwargs))
            try:
                return driver.finish()
            finally:
                driver.close()

        return run

    def bind_items(self, operation: Items[Any, Any]) -> Callable[..., Iterator[Any]]:
        def run(*args: Any, **kwargs: Any) -> Iterator[Any]:
            driver = _Driver(self, operation.plan(self, *args, **kwargs))
            try:
                while not isinstance(step := driver.advance(), Done):
                    yield step.item
            finally:
                driver.close()

        return run


class _Driver:
    """Carries out one plan's steps for a Client; holds the stream the plan has open."""

    def __init__(self, client: Client, plan: Any) -> None:
        self.client, self.stepper = client, Stepper(plan)
        self.stream: Any = None
        self.lines: Iterator[str] | None = None

    def advance(self) -> Emit | Done:
        while True:
            step = self.stepper.next()
            if isinstance(step, Emit | Done):
                return step
            try:
                self.stepper.give(self.do(step))
            except httpx.TransportError as exc:
                self.stepper.fail(exc)

    def finish(self) -> Any:
        step = self.advance()
        if isinstance(step, Emit):
            raise TypeError("an iterating operation run as a call")
        return step.value

    def do(self, step: Any) -> Any:
        http = self.client.http
        if isinstance(step, Attempt):
            return http.request(**step.request.arguments())
        if isinstance(step, Sleep):
            return self.client.sleep(step.seconds)
        if isinstance(step, Open):
            self.close_stream()
            stream = http.stream(**step.request.arguments())
            response = stream.__enter__()
            if response.status_code >= 400:
                response.read()
                stream.__exit__(None, None, None)
                return response
            self.stream, self.lines = stream, response.iter_lines()
            return response
        if isinstance(step, ReadLine):
            return next(self.lines, None) if self.lines is not None else None
        if isinstance(step, Close):
            return self.close_stream()
        raise TypeError(f"not a step: {step!r}")

    def close_stream(self) -> None:
        stream, self.stream, self.lines = self.stream, None, None
        if stream is not None:
            stream.__exit__(None, None, None)

    def close(self) -> None:
        try:
            self.stepper.close()
        finally:
            self.close_stream()


class AsyncClient(Operations):
    """The API over an asynchronous httpx client: the same methods as ``Client``, each a
    coroutine (or, for the iterating ones, an async iterator).

    ``sleep``: the coroutine its waits use (``asyncio.sleep``); the rest as ``Client``."""

    def __init__(
        self,
        url: str,
        key: str,
        *,
        dataset: str | None = None,
        timeout: float = 30.0,
        retries: Retry | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        **httpx_options: Any,
    ) -> None:
        super().__init__(dataset=dataset, retries=retries, clock=clock)
        self.sleep = sleep
        self.http = httpx.AsyncClient(
            base_url=url.rstrip("/"), headers=_headers(key), timeout=timeout, **httpx_options
        )

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self.http.aclose()

    def bind_call(self, operation: Call[Any, Any]) -> Callable[..., Awaitable[Any]]:
        async def run(*args: Any, **kwargs: Any) -> Any:
            driver = _AsyncDriver(self, operation.plan(self, *args, **kwargs))
            try:
                return await driver.finish()
            finally:
                await driver.close()

        return run

    def bind_items(self, operation: Items[Any, Any]) -> Callable[..., AsyncIterator[Any]]:
        async def run(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
            driver = _AsyncDriver(self, operation.plan(self, *args, **kwargs))
            try:
                while not isinstance(step := await driver.advance(), Done):
                    yield step.item
            finally:
                await driver.close()

        return run


class _AsyncDriver:
    """Carries out one plan's steps for an AsyncClient (as ``_Driver``, awaiting each)."""

    def __init__(self, client: AsyncClient, plan: Any) -> None:
        self.client, self.stepper = client, Stepper(plan)
        self.stream: Any = None
        self.lines: AsyncIterator[str] | None = None

    async def advance(self) -> Emit | Done:
        while True:
            step = self.stepper.next()
            if isinstance(step, Emit | Done):
                return step
            try:
                self.stepper.give(await self.do(step))
            except httpx.TransportError as exc:
                self.stepper.fail(exc)

    async def finish(self) -> Any:
        step = await self.advance()
        if isinstance(step, Emit):
            raise TypeError("an iterating operation run as a call")
        return step.value

    async def do(self, step: Any) -> Any:
        http = self.client.http
        if isinstance(step, Attempt):
            return await http.request(**step.request.arguments())
        if isinstance(step, Sleep):
            return await self.client.sleep(step.seconds)
        if isinstance(step, Open):
            await self.close_stream()
            stream = http.stream(**step.request.arguments())
            response = await stream.__aenter__()
            if response.status_code >= 400:
                await response.aread()
                await stream.__aexit__(None, None, None)
                return response
            self.stream, self.lines = stream, response.aiter_lines()
            return response
        if isinstance(step, ReadLine):
            return await anext(self.lines, None) if self.lines is not None else None
        if isinstance(step, Close):
            return await self.close_stream()
        raise TypeError(f"not a step: {step!r}")

    async def close_stream(self) -> None:
        stream, self.stream, self.lines = self.stream, None, None
        if stream is not None:
            await stream.__aexit__(None, None, None)

    async def close(self) -> None:
        try:
            self.stepper.close()
        finally:
            await self.close_stream()
