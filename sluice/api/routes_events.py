"""``GET /v1/events``: the job event log as server-sent events, of the key's datasets.

Each event's ``id`` is its job event id; a client that reconnects with ``Last-Event-ID`` (or
``?last_event_id=``) gets every later event once, in order, from whichever API process it reaches.
``Last-Event-ID: 0`` replays from the oldest event kept; without one the stream starts now. A
comment every ``SLUICE_API_KEEPALIVE_SECONDS`` (15) keeps proxies from closing a quiet stream.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Header, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse

from sluice.api.dependencies import Key
from sluice.api.event_stream import EventCursor, open_cursor, poll
from sluice.api.problems import Problem
from sluice.api.schemas import problems
from sluice.settings import get_settings

router = APIRouter(tags=["events"])
POLL_SECONDS = 0.2


async def _stream(request: Request, cursor: EventCursor, until: float | None) -> AsyncIterator[str]:
    yield "retry: 2000\n\n"
    keepalive = get_settings().api_keepalive_seconds
    beat = time.monotonic()
    while until is None or time.monotonic() < until:
        if await request.is_disconnected():
            return
        for event in await run_in_threadpool(poll, cursor):
            data = json.dumps(event.data, separators=(",", ":"))
            yield f"id: {event.id}\nevent: {event.type}\ndata: {data}\n\n"
            beat = time.monotonic()
        if time.monotonic() - beat >= keepalive:
            yield ": keep-alive\n\n"
            beat = time.monotonic()
        await asyncio.sleep(POLL_SECONDS)


@router.get(
    "/v1/events",
    responses={
        200: {"content": {"text/event-stream": {"schema": {"type": "string"}}}},
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
    return StreamingResponse(
        _stream(request, cursor, until),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
