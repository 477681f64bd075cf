"""How the client talks to the API, without doing any I/O: a request, the steps of a plan (a
generator that yields what it needs done: one try of a request, a sleep, a stream's next line) and
the two descriptors that make one plan a method of the sync client (it returns the result) and of
the async one (it returns an awaitable, or an async iterator). Each operation is written once, in
``sluice.client.operations``; the clients only carry the steps out."""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Iterator
from dataclasses import dataclass, field
from typing import Any, Concatenate, Generic, ParamSpec, Protocol, TypeVar, overload

import httpx

from .retrying import retry_after

P = ParamSpec("P")
T = TypeVar("T")
Plan = Generator[Any, Any, T]


class ApiError(Exception):
    """An answer of the API that is an error (``application/problem+json``): its ``status``,
    stable ``code``, ``detail``, ``hint`` (what to do) and the whole ``body``."""

    def __init__(
        self,
        status: int,
        code: str,
        detail: str,
        body: dict | None = None,
        *,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(f"{status} {code}: {detail}")
        self.status, self.code, self.detail, self.body = status, code, detail, body or {}
        self.retry_after = retry_after

    @property
    def hint(self) -> str | None:
        hint = self.body.get("hint")
        return hint if isinstance(hint, str) else None


class DatasetNeeded(ValueError):
    """A call that names no dataset, with a key that does not reach exactly one."""

    def __init__(self, reachable: list[str]) -> None:
        seen = ", ".join(reachable[:10]) + (", ..." if len(reachable) > 10 else "")
        super().__init__(
            "name the dataset (dataset=...): this key reaches "
            + (f"{len(reachable)} datasets ({seen})" if reachable else "no dataset")
        )
        self.reachable = reachable


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    params: dict[str, Any] | None = None
    json: Any = None
    files: list[tuple[str, Any]] | None = None
    data: dict[str, str] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    timeout: httpx.Timeout | None = None

    def arguments(self) -> dict[str, Any]:
        """Keyword arguments of httpx's ``request`` and ``stream``."""
        given = {
            "params": self.params,
            "json": self.json,
            "files": self.files,
            "data": self.data,
            "headers": self.headers or None,
        }
        found: dict[str, Any] = {k: v for k, v in given.items() if v is not None}
        if self.timeout is not None:
            found["timeout"] = self.timeout
        return {"method": self.method, "url": self.path, **found}


# --- the steps a plan yields ----------------------------------------------------------------------


@dataclass(frozen=True)
class Attempt:
    """Send the request once; the answer (read whole) comes back, or the transport error."""

    request: Request


@dataclass(frozen=True)
class Sleep:
    seconds: float


@dataclass(frozen=True)
class Open:
    """Open a stream; its answer comes back (an error answer read whole and closed)."""

    request: Request


@dataclass(frozen=True)
class ReadLine:
    """The open stream's next line; None at its end."""


@dataclass(frozen=True)
class Close:
    """Close the open stream (nothing when none is open)."""


@dataclass(frozen=True)
class Emit:
    """An item for the caller of an iterating method."""

    item: Any


@dataclass(frozen=True)
class Done:
    value: Any


class Stepper:
    """Walks a plan: the next step, with the outcome of the last one sent in or thrown in."""

    def __init__(self, plan: Plan[Any]) -> None:
        self.plan = plan
        self._value: Any = None
        self._error: BaseException | None = None

    def next(self) -> Any:
        try:
            if self._error is not None:
                error, self._error = self._error, None
                return self.plan.throw(error)
            value, self._value = self._value, None
            return self.plan.send(value)
        except StopIteration as done:
            return Done(done.value)

    def give(self, value: Any) -> None:
        self._value = value

    def fail(self, error: BaseException) -> None:
        self._error = error

    def close(self) -> None:
        self.plan.close()


# --- one plan, a method of both clients -----------------------------------------------------------


class Blocking(Protocol):
    """A client whose methods block (``Client``): the one with ``close``."""

    def close(self) -> None: ...


class Asynchronous(Protocol):
    """A client whose methods are awaited (``AsyncClient``): the one with ``aclose``."""

    async def aclose(self) -> None: ...


def _signature(plan: Callable[..., Any]) -> inspect.Signature:
    """The plan's signature as its callers see it: without ``self``."""
    sig = inspect.signature(plan)
    return sig.replace(parameters=list(sig.parameters.values())[1:])


class Call(Generic[P, T]):
    """An operation that answers once: ``Client`` returns its result, ``AsyncClient`` an
    awaitable of it. ``route``: the API operation it calls (``GET /v1/jobs/{job_id}``)."""

    def __init__(self, plan: Callable[Concatenate[Any, P], Plan[T]], route: str) -> None:
        self.plan, self.route = plan, route
        self.signature = _signature(plan)
        self.__doc__, self.__name__ = plan.__doc__, plan.__name__

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> Call[P, T]: ...
    @overload
    def __get__(self, obj: Blocking, owner: type | None = None) -> Callable[P, T]: ...
    @overload
    def __get__(
        self, obj: Asynchronous, owner: type | None = None
    ) -> Callable[P, Awaitable[T]]: ...
    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self
        bound = obj.bind_call(self)
        bound.__name__, bound.__doc__, bound.__signature__ = (
            self.__name__,
            self.__doc__,
            self.signature,
        )
        return bound


class Items(Generic[P, T]):
    """An operation that gives items as they come: ``Client`` returns an iterator, ``AsyncClient``
    an async iterator (close it, or leave its loop, to end it)."""

    def __init__(self, plan: Callable[Concatenate[Any, P], Plan[None]], route: str) -> None:
        self.plan, self.route = plan, route
        self.signature = _signature(plan)
        self.__doc__, self.__name__ = plan.__doc__, plan.__name__

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> Items[P, T]: ...
    @overload
    def __get__(self, obj: Blocking, owner: type | None = None) -> Callable[P, Iterator[T]]: ...
    @overload
    def __get__(
        self, obj: Asynchronous, owner: type | None = None
    ) -> Callable[P, AsyncIterator[T]]: ...
    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self
        bound = obj.bind_items(self)
        bound.__name__, bound.__doc__, bound.__signature__ = (
            self.__name__,
            self.__doc__,
            self.signature,
        )
        return bound


def call(route: str) -> Callable[[Callable[Concatenate[Any, P], Plan[T]]], Call[P, T]]:
    """Make a plan a method that answers once (see ``Call``)."""

    def make(plan: Callable[Concatenate[Any, P], Plan[T]]) -> Call[P, T]:
        return Call(plan, route)

    return make


def items(
    route: str, of: type[T]
) -> Callable[[Callable[Concatenate[Any, P], Plan[None]]], Items[P, T]]:
    """Make a plan that emits ``of`` items a method that iterates (see ``Items``)."""

    def make(plan: Callable[Concatenate[Any, P], Plan[None]]) -> Items[P, T]:
        return Items(plan, route)

    return make


def raise_for(response: httpx.Response) -> None:
    """ApiError for an error answer (problem+json, or whatever else the server said)."""
    if response.status_code < 400:
        return
    try:
        body = response.json()
    except ValueError:
        body = None
    if not isinstance(body, dict):
        body = {}
    raise ApiError(
        response.status_code,
        str(body.get("code", f"http_{response.status_code}")),
        str(body.get("detail", response.text[:200])),
        body,
        retry_after=retry_after(response),
    )
