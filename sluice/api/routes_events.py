"""``GET /v1/events``: the job event log as server-sent events, of the key's datasets.

Each event's ``id`` is its job event id; a client that reconnects with ``Last-Event-ID`` (or
``?last_event_id=``) gets every later event once, in order, from whichever API process it reaches.
``Last-Event-ID: 0`` replays from the oldest event kept; without one the stream starts now. A
comment every ``SLUICE_API_KEEPALIVE_SECONDS`` (15) keeps proxies from closing a quiet stream.

A stream ends with a last comment saying why (``: closed: ...``) when its key is revoked, its
datasets are deleted (every poll checks both: ``event_stream.check_reach``) or the API stops
(``closing``, set on SIGINT/SIGTERM by the server's lifespan). One key holds at most
``SLUICE_API_MAX_STREAMS_PER_KEY`` streams of this process open at once; the next is 429
``too_many_streams``.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import Annotated

from fastapi import APIRouter, Header, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from sluice.api import examples
from sluice.api.dependencies import Key
from sluice.api.event_stream import EventCursor, StreamEnded, open_cursor, poll
from sluice.api.problems import Problem
from sluice.api.schemas import problems
from sluice.errors import OperationError
from sluice.settings import get_settings

router = APIRouter(tags=["events"])
POLL_SECONDS = 0.2
STREAM_RETRY_SECONDS = 5


class TooManyStreams(OperationError):
    """A key asked for one more event stream than ``SLUICE_API_MAX_STREAMS_PER_KEY`` allows."""

    code, status = "too_many_streams", 429
    hint = "Close a stream of this key first (one stream per client is enough), or raise the limit."
    headers = {"Retry-After": str(STREAM_RETRY_SECONDS)}  # noqa: RUF012 (a class default)


class Streams:
    """The open streams of this process per key, and the event that tells them the API stops."""

    def __init__(self) -> None:
        self._open: Counter[int] = Counter()
        self._lock = threading.Lock()
        self.closing: asyncio.Event | None = None  # made by the lifespan, on the server's loop

    def take(self, key_id: int, limit: int) -> Callable[[], None]:
        """A place for one more stream of the key, and the function that gives it back."""
        with self._lock:
            if self._open[key_id] >= limit:
                raise TooManyStreams(
                    f"this key has {self._open[key_id]} event streams open already, the most "
                    f"one key may hold (SLUICE_API_MAX_STREAMS_PER_KEY={limit})"
                )
            self._open[key_id] += 1
        released = False

        def release() -> None:
            nonlocal released
            with self._lock:
                if released:
                    return
                released = True
                self._open[key_id] -= 1
                if self._open[key_id] <= 0:
                    del self._open[key_id]

        return release

    def count(self, key_id: int) -> int:
        with self._lock:
            return self._open[key_id]

    def close_all(self) -> None:
        """Every stream's loop ends at its next look (now, for those waiting)."""
        if self.closing is not None:
            self.closing.set()


streams = Streams()


class _StreamResponse(StreamingResponse):
    """A streaming answer that gives its key's place back however it ends (finished, the client
    gone, cancelled), also when it never started to send."""

    def __init__(self, content: AsyncIterator[str], release: Callable[[], None], **kw) -> None:
        super().__init__(content, **kw)
        self._release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._release()


async def _pause(closing: asyncio.Event | None) -> bool:
    """Wait a poll interval; True when the API stops meanwhile."""
    if closing is None:
        await asyncio.sleep(POLL_SECONDS)
        return False
    try:
        await asyncio.wait_for(closing.wait(), POLL_SECONDS)
    except TimeoutError:
        return False
    return True


async def _stream(request: Request, cursor: EventCursor, until: float | None) -> AsyncIterator[str]:
    yield "retry: 2000\n\n"
    keepalive = get_settings().api_keepalive_seconds
    closing = streams.closing
    beat = time.monotonic()
    while until is None or time.monotonic() < until:
        if closing is not None and closing.is_set():
            yield ": closed: the API is stopping\n\n"
            return
        if await request.is_disconnected():
            return
        try:
            batch = await run_in_threadpool(poll, cursor)
        except StreamEnded as ended:
            yield f": closed: {ended}\n\n"
            return
        for event in batch:
            data = json.dumps(event.data, separators=(",", ":"))
            yield f"id: {event.id}\nevent: {event.type}\ndata: {data}\n\n"
            beat = time.monotonic()
        if time.monotonic() - beat >= keepalive:
            yield ": keep-alive\n\n"
            beat = time.monotonic()
        if await _pause(closing):
            yield ": closed: the API is stopping\n\n"
            return


@router.get(
    "/v1/events",
    responses={
        200: {
            "content": {
                "text/event-stream": {"schema": {"type": "string"}, "example": examples.EVENTS}
            }
        },
        **problems(401, 404, 422, 429),
    },
    response_class=StreamingResponse,
)
async def events(
    request: Request,
    key: Key,
    dataset: str | None = None,
    last_event_id: Annotated[
        str | None, Query(description="resume after this event id (as the header)")
    ] = None,
    last_event_id_header: Annotated[str | None, Header(alias="Last-Event-ID")] = None,
    seconds: Annotated[
        float | None, Query(gt=0, le=86400, description="end the stream after this long")
    ] = None,
) -> StreamingResponse:
    raw = last_event_id_header if last_event_id_header is not None else last_event_id
    if raw is not None and not (raw.strip().isdigit() and len(raw.strip()) <= 18):
        raise Problem(422, "invalid_request", "Last-Event-ID: an event id (a whole number)")
    after = int(raw) if raw is not None else None
    cursor = await run_in_threadpool(open_cursor, key, dataset=dataset, after=after)
    until = time.monotonic() + seconds if seconds else None
    release = streams.take(key.id, get_settings().api_max_streams_per_key)
    return _StreamResponse(
        _stream(request, cursor, until),
        release,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
