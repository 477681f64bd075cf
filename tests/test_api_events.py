"""The event stream (``GET /v1/events``) over a real API process that is killed in the middle of a
run: a client that reconnects with ``Last-Event-ID`` gets every event once, in order."""

from __future__ import annotations

import os

import pytest
from sqlmodel import Session, select

from sluice.api.event_stream import EVENT_TYPES
from sluice.client import Client, Event
from sluice.ops import actions
from sluice.ops.access import cli_operator
from sluice.ops.reads import ctx
from sluice.storage.models import JobEvent
from tests.support.api_server import ApiServer, make_key

pytestmark = pytest.mark.slow
FILES = 6


def _collect(client: Client, after: int, done, seconds: float = 60) -> list[Event]:
    got: list[Event] = []
    for event in client.events(last_event_id=after, seconds=seconds):
        got.append(event)
        if done(got):
            break
    return got


def _logged() -> list[tuple[int, str]]:
    with Session(ctx().engine) as session:
        rows = session.exec(
            select(JobEvent.id, JobEvent.kind)
            .where(JobEvent.kind.in_(list(EVENT_TYPES)))
            .order_by(JobEvent.id)
        ).all()
    return [(i, EVENT_TYPES[k]) for i, k in rows]


def test_a_client_resumes_after_the_api_dies_and_misses_nothing(
    database_url, sluice_env, start_worker, tmp_path
):
    start_worker()
    token = make_key("watcher", datasets=None, scope="ingest")
    api = ApiServer(dict(os.environ), tmp_path / "api-1.log")
    api.start()
    client = Client(api.url, token)
    for i in range(FILES // 2):
        client.upload(f"first half, file {i} ".encode() * 200, filename=f"a{i}.txt")

    def succeeded(events: list[Event]) -> set[int]:
        return {e.data["job"]["id"] for e in events if e.type == "job.succeeded"}

    before = _collect(client, 0, lambda got: len(succeeded(got)) >= 1)
    api.kill9()  # in the middle of the run: jobs are still queued or running
    client.close()
    for i in range(FILES // 2):  # the work goes on while the API is down
        ok = actions.upload(
            cli_operator(),
            dataset="default",
            filename=f"b{i}.txt",
            stream=__import__("io").BytesIO(f"second half, file {i} ".encode() * 200),
        )
        assert ok.accepted
    again = ApiServer(dict(os.environ), tmp_path / "api-2.log", port=api.port)
    again.start()
    try:
        client = Client(again.url, token)
        seen = succeeded(before)
        after = _collect(
            client, before[-1].id, lambda got: len(seen | succeeded(got)) == FILES, seconds=90
        )
    finally:
        client.close()
        again.stop()
    ids = [e.id for e in before + after]
    assert ids == sorted(set(ids)), "an event came twice or out of order"
    assert [(e.id, e.type) for e in before + after] == _logged()  # and none is missing
    assert {e.type for e in before + after} >= {"job.queued", "job.progress", "job.succeeded"}
