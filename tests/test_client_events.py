"""The client's event stream resumes by itself: a real ``sluice serve api`` killed (or stopped) in
the middle of a run comes back on the same port, and one iterator of ``Client.events`` (or
``AsyncClient.events``) goes on with ``Last-Event-ID``, missing nothing and seeing nothing twice.
The API comes back inside the client's sleep hook, so no wait is guessed. A stream the API ends
for good (a revoked key) raises StreamClosed instead of opening again."""

from __future__ import annotations

import asyncio
import io
import os
from typing import Any

import httpx
import pytest
from sqlmodel import Session, select

from sluice.api.event_stream import EVENT_TYPES
from sluice.client import AsyncClient, Client, Event, StreamClosed
from sluice.ops import actions, keys
from sluice.ops.access import cli_operator
from sluice.ops.reads import ctx as read_ctx
from sluice.storage.models import JobEvent
from tests.support.api_server import ApiServer, make_key

FILES = 6


def _logged() -> list[tuple[int, str]]:
    with Session(read_ctx().engine) as session:
        rows = session.exec(
            select(JobEvent.id, JobEvent.kind)
            .where(JobEvent.kind.in_(list(EVENT_TYPES)))
            .order_by(JobEvent.id)
        ).all()
    return [(i, EVENT_TYPES[k]) for i, k in rows]


def _succeeded(events: list[Event]) -> set[int]:
    return {e.data["job"]["id"] for e in events if e.type == "job.succeeded"}


def _upload_while_down() -> None:
    for i in range(FILES // 2):
        made = actions.upload(
            cli_operator(),
            dataset="default",
            filename=f"b{i}.txt",
            stream=io.BytesIO(f"second half, file {i} ".encode() * 200),
        )
        assert made.accepted


class Restarts:
    """The API process of the test: taken down by ``down()``, brought back on the same port by
    the client's first sleep after that."""

    def __init__(self, tmp_path, how: str) -> None:
        self.tmp_path, self.how = tmp_path, how
        self.api = ApiServer(dict(os.environ), tmp_path / "api-0.log")
        self.started = [self.api]
        self.slept: list[float] = []
        self.opened: list[dict[str, str]] = []  # the headers of each GET /v1/events

    def down(self) -> None:
        if self.how == "kill9":
            self.api.kill9()
        else:
            self.api.stop()  # SIGTERM: every stream ends with ": closed: the API is stopping"
        _upload_while_down()

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        if self.api.alive():
            return
        self.api = ApiServer(
            dict(os.environ), self.tmp_path / f"api-{len(self.started)}.log", port=self.api.port
        )
        self.started.append(self.api)
        self.api.start()

    async def asleep(self, seconds: float) -> None:
        await asyncio.to_thread(self.sleep, seconds)

    def record(self, request: httpx.Request) -> None:
        if request.url.path == "/v1/events":
            self.opened.append(dict(request.headers))

    async def arecord(self, request: httpx.Request) -> None:
        self.record(request)

    def stop(self) -> None:
        for api in self.started:
            api.stop()


def _follow_sync(world: Restarts, token: str) -> list[Event]:
    got: list[Event] = []
    hooks = {"request": [world.record]}
    with Client(world.api.url, token, sleep=world.sleep, event_hooks=hooks) as client:
        for i in range(FILES // 2):
            client.upload(f"first half, file {i} ".encode() * 200, filename=f"a{i}.txt")
        stream = client.events(last_event_id=0, seconds=120)
        for event in stream:
            got.append(event)
            if _succeeded(got) and len(world.started) == 1 and world.api.alive():
                world.down()  # between two events: the iterator waits, its connection open
            if len(_succeeded(got)) == FILES:
                break
        stream.close()
    return got


async def _follow_async(world: Restarts, token: str) -> list[Event]:
    got: list[Event] = []
    hooks = {"request": [world.arecord]}
    async with AsyncClient(world.api.url, token, sleep=world.asleep, event_hooks=hooks) as client:
        for i in range(FILES // 2):
            await client.upload(f"first half, file {i} ".encode() * 200, filename=f"a{i}.txt")
        stream = client.events(last_event_id=0, seconds=120)
        try:
            async for event in stream:
                got.append(event)
                if _succeeded(got) and len(world.started) == 1 and world.api.alive():
                    await asyncio.to_thread(world.down)
                if len(_succeeded(got)) == FILES:
                    break
        finally:
            await stream.aclose()
    return got


@pytest.mark.parametrize(("kind", "how"), [("sync", "kill9"), ("async", "sigterm")])
def test_one_event_iterator_resumes_across_an_api_restart_and_misses_nothing(
    kind, how, ctx, start_worker, tmp_path
):
    start_worker()
    token = make_key("watcher", datasets=None, scope="ingest")
    world = Restarts(tmp_path, how)
    world.api.start()
    try:
        if kind == "sync":
            got = _follow_sync(world, token)
        else:
            got = asyncio.run(_follow_async(world, token))
    finally:
        world.stop()
    assert len(world.started) == 2, "the API was brought back once, in the client's sleep"
    assert world.slept and all(0 < s <= 8 for s in world.slept)
    ids = [e.id for e in got]
    assert ids == sorted(set(ids)), "an event came twice or out of order"
    assert [(e.id, e.type) for e in got] == _logged()[: len(got)]  # and none is missing
    assert len(_succeeded(got)) == FILES
    # the first stream asked from the oldest; every later one after the last event it had seen
    assert world.opened[0]["last-event-id"] == "0"
    resumed = [int(h["last-event-id"]) for h in world.opened[1:]]
    assert resumed and all(r in ids for r in resumed)


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_stream_closed_for_good_raises_instead_of_opening_again(kind, ctx, tmp_path):
    api = ApiServer(dict(os.environ), tmp_path / "api.log")
    api.start()
    token = make_key("short-lived", datasets=["default"], scope="ingest")
    opened: list[str] = []

    def record(request: httpx.Request) -> None:
        opened.append(request.url.path)

    async def arecord(request: httpx.Request) -> None:
        record(request)

    def revoke() -> None:
        assert keys.revoke_key(cli_operator(), "short-lived")[0]

    try:
        if kind == "sync":
            with Client(api.url, token, event_hooks={"request": [record]}) as client:
                client.upload_text("a text " * 50, filename="t.txt")
                stream = client.events(last_event_id=0, seconds=60)
                first = next(stream)
                revoke()
                with pytest.raises(StreamClosed) as closed:
                    list(stream)
        else:

            async def run() -> Any:
                async with AsyncClient(
                    api.url, token, event_hooks={"request": [arecord]}
                ) as client:
                    await client.upload_text("a text " * 50, filename="t.txt")
                    stream = client.events(last_event_id=0, seconds=60)
                    got = await anext(stream)
                    revoke()
                    with pytest.raises(StreamClosed) as raised:
                        async for _ in stream:
                            pass
                    return got, raised

            first, closed = asyncio.run(run())
    finally:
        api.stop()
    assert first.type == "job.queued"
    assert closed.value.reason == "the key was revoked"
    assert opened.count("/v1/events") == 1, "a stream closed for good is not opened again"
