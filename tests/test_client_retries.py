"""The client's retries (sluice.client.retrying) against real HTTP servers: a small server in a
thread of the test that answers what each test scripts (503 with ``Retry-After`` twice, then 200),
and a real ``sluice serve api`` whose rate limit answers 429. Waits are measured with the client's
clock and sleep hooks (a fake clock that moves only when the client sleeps), never wall time."""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from sluice.client import ApiError, AsyncClient, Client, Retry
from sluice.client.retrying import retry_after
from tests.support.api_server import ApiServer, make_key
from tests.support.servers import free_port

Answer = tuple[int, dict[str, str], dict[str, Any]]
HEALTH: Answer = (200, {}, {"status": "ok", "version": "test", "ready": True})
NO_HITS: Answer = (200, {}, {"hits": []})


def busy(seconds: int | None = None, status: int = 503) -> Answer:
    headers = {} if seconds is None else {"Retry-After": str(seconds)}
    code = "rate_limited" if status == 429 else "vector_store_unavailable"
    return (status, headers, {"status": status, "code": code, "detail": "busy", "title": "x"})


class Scripted:
    """An HTTP server in a thread: each request gets the next scripted answer (the last one
    repeats); every request's method, path and headers are kept in ``seen``."""

    def __init__(self, answers: list[Answer]) -> None:
        self.answers = list(answers)
        self.seen: list[tuple[str, str, dict[str, str]]] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                owner.seen.append((self.command, self.path, dict(self.headers)))
                status, headers, body = (
                    owner.answers.pop(0) if len(owner.answers) > 1 else owner.answers[0]
                )
                data = json.dumps(body).encode()
                self.send_response(status)
                for name, value in {"Content-Type": "application/json", **headers}.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PATCH = do_DELETE = answer

            def log_message(self, *_: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Scripted:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)


class FakeTime:
    """A monotonic clock that moves only when the client sleeps; the sleeps are kept."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds

    async def asleep(self, seconds: float) -> None:
        self.sleep(seconds)


def caller(kind: str, url: str, time: FakeTime, **options: Any) -> Callable[..., Any]:
    """``call(method, *args)``: one call of the sync or the async client, with the fake time."""

    def call(method: str, *args: Any, **kwargs: Any) -> Any:
        if kind == "sync":
            with Client(url, "key", clock=time.clock, sleep=time.sleep, **options) as client:
                return getattr(client, method)(*args, **kwargs)

        async def run() -> Any:
            async with AsyncClient(
                url, "key", clock=time.clock, sleep=time.asleep, **options
            ) as client:
                return await getattr(client, method)(*args, **kwargs)

        return asyncio.run(run())

    return call


KINDS = pytest.mark.parametrize("kind", ["sync", "async"])


@KINDS
def test_a_503_with_retry_after_twice_then_200_waits_exactly_what_it_says(kind):
    time = FakeTime()
    with Scripted([busy(2), busy(3), HEALTH]) as server:
        health = caller(kind, server.url, time)("health")
    assert health.ready is True
    assert time.slept == [2.0, 3.0]
    assert len(server.seen) == 3


@KINDS
def test_every_try_of_a_post_carries_the_same_idempotency_key_and_each_call_its_own(kind):
    time = FakeTime()
    with Scripted([busy(1, 429), busy(1), NO_HITS]) as server:
        call = caller(kind, server.url, time)
        assert call("search", "anything", dataset="docs") == []
        assert call("search", "anything", dataset="docs") == []
    keys = [headers.get("Idempotency-Key") for _, _, headers in server.seen]
    assert len(keys) == 4 and keys[0]
    assert keys[0] == keys[1] == keys[2], "a retry must replay the first try's key"
    assert keys[3] != keys[0], "a new call is a new request: a new key"
    assert time.slept == [1.0, 1.0]
    with Scripted([NO_HITS]) as server:
        caller(kind, server.url, time)("search", "q", dataset="docs", idempotency_key="mine-1")
    assert server.seen[0][2]["Idempotency-Key"] == "mine-1"


@KINDS
def test_retries_stop_after_the_attempts_allowed(kind):
    time = FakeTime()
    with Scripted([busy(1)]) as server, pytest.raises(ApiError) as raised:
        caller(kind, server.url, time, retries=Retry(attempts=3))("health")
    assert raised.value.status == 503 and raised.value.code == "vector_store_unavailable"
    assert len(server.seen) == 3 and time.slept == [1.0, 1.0]


@KINDS
def test_no_wait_goes_past_the_total_time(kind):
    time = FakeTime()
    retries = Retry(attempts=10, total_seconds=20)
    with Scripted([busy(5), busy(30)]) as server, pytest.raises(ApiError) as raised:
        caller(kind, server.url, time, retries=retries)("health")
    assert raised.value.retry_after == 30.0  # more than is left of the 20 s: raised at once
    assert len(server.seen) == 2 and time.slept == [5.0]
    time = FakeTime()
    with Scripted([busy(8)]) as server, pytest.raises(ApiError):
        caller(kind, server.url, time, retries=retries)("health")
    assert time.slept == [8.0, 8.0] and len(server.seen) == 3  # 16 s waited; 24 would pass 20


@KINDS
def test_without_retry_after_the_waits_back_off_within_bounds(kind):
    time = FakeTime()
    retries = Retry(attempts=5, backoff_seconds=1.0, max_backoff_seconds=3.0)
    with Scripted([busy(), busy(), busy(), busy(), HEALTH]) as server:
        caller(kind, server.url, time, retries=retries)("health")
    assert len(time.slept) == 4
    for wait, full in zip(time.slept, [1.0, 2.0, 3.0, 3.0], strict=True):
        assert full / 2 <= wait <= full, time.slept


@KINDS
def test_retries_off_send_no_key_and_try_once(kind):
    time = FakeTime()
    with Scripted([busy(1)]) as server, pytest.raises(ApiError):
        caller(kind, server.url, time, retries=Retry(attempts=1))("search", "q", dataset="d")
    assert len(server.seen) == 1 and "Idempotency-Key" not in server.seen[0][2]
    assert time.slept == []


@KINDS
def test_a_refused_connection_is_tried_again_then_raised(kind):
    time = FakeTime()
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with pytest.raises(httpx.ConnectError):
        caller(kind, url, time, retries=Retry(attempts=3, backoff_seconds=0.5))("health")
    assert len(time.slept) == 2 and 0.25 <= time.slept[0] <= 0.5 and 0.5 <= time.slept[1] <= 1.0


def test_retry_after_reads_seconds_and_http_dates():
    def answer(value: str) -> httpx.Response:
        return httpx.Response(503, headers={"Retry-After": value})

    assert retry_after(answer("7")) == 7.0
    assert retry_after(answer("soon")) is None
    assert retry_after(httpx.Response(503)) is None
    later = format_datetime(datetime.now(UTC) + timedelta(seconds=30), usegmt=True)
    assert 27 <= (retry_after(answer(later)) or 0) <= 30
    earlier = format_datetime(datetime.now(UTC) - timedelta(seconds=30), usegmt=True)
    assert retry_after(answer(earlier)) == 0.0
    with pytest.raises(ValueError):
        Retry(attempts=0)


@KINDS
def test_the_real_apis_429_is_waited_for_as_its_retry_after_says(kind, sluice_env, tmp_path):
    api = ApiServer({**os.environ, "SLUICE_API_RATE_PER_MINUTE": "2"}, tmp_path / "api.log")
    api.start()
    answers: list[httpx.Response] = []
    time = FakeTime()
    hooks: dict[str, Any] = {"response": [answers.append]}
    if kind == "async":

        async def keep(response: httpx.Response) -> None:
            answers.append(response)

        hooks = {"response": [keep]}
    try:
        token = make_key("busy", datasets=["default"], scope="read")
        retries = Retry(attempts=3, total_seconds=1000)

        def call(method: str) -> Any:
            if kind == "sync":
                with Client(
                    api.url,
                    token,
                    retries=retries,
                    clock=time.clock,
                    sleep=time.sleep,
                    event_hooks=hooks,
                ) as client:
                    return getattr(client, method)()

            async def run() -> Any:
                async with AsyncClient(
                    api.url,
                    token,
                    retries=retries,
                    clock=time.clock,
                    sleep=time.asleep,
                    event_hooks=hooks,
                ) as client:
                    return await getattr(client, method)()

            return asyncio.run(run())

        assert [d.name for d in call("datasets")] == ["default"]
        assert [d.name for d in call("datasets")] == ["default"]
        with pytest.raises(ApiError) as raised:
            call("datasets")  # the minute's budget is spent: 429 three times (the fake time)
    finally:
        api.stop()
    assert raised.value.status == 429 and raised.value.code == "rate_limited"
    refused = [r for r in answers if r.status_code == 429]
    assert len(refused) == 3
    said = [float(r.headers["Retry-After"]) for r in refused]
    assert all(1 <= s <= 60 for s in said)
    assert time.slept == said[:2], "each wait is what the API's Retry-After said"
