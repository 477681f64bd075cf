"""Security of the queue: messages are data, and a queue or cache Redis off loopback needs a
password.

Each test attacks the real process: a pickle pushed with a plain Redis client onto the queue a real
huey_consumer reads, the queue lookups the console and ``sluice recover`` make, and ``sluice serve``
started on this machine's non-loopback address.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys

import pytest
import redis

from sluice.ops import health
from sluice.ops.ingest import ingest_bytes
from sluice.pipeline.queueing import broker, publishing
from tests.conftest import QUEUE_NAME
from tests.support.helpers import wait_for


class _Payload:
    """Unpickling this makes a directory: proof that a message ran code."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def _poison(client: redis.Redis, marker) -> None:
    data = pickle.dumps(_Payload(str(marker)))
    client.lpush(f"huey.redis.{QUEUE_NAME}", data)
    client.zadd(f"huey.schedule.{QUEUE_NAME}", {data: 0})


def test_a_pickle_on_the_queue_runs_nowhere(ctx, services, start_worker, tmp_path):
    worker_marker = tmp_path / "ran-in-worker"
    _poison(services.queue.client(), worker_marker)
    start_worker()
    accepted = ingest_bytes(
        ctx,
        b"Tide tables list high and low water for each harbour. " * 20,
        filename="tides.txt",
        dataset="default",
        publish=publishing.publish,
    )
    [done] = wait_for(ctx, [accepted.job_id], timeout=60)
    assert done.status.value == "succeeded"  # the worker read past the bad message and kept working
    assert not worker_marker.exists(), "the worker unpickled a queue message"

    console_marker = tmp_path / "ran-in-console"
    _poison(services.queue.client(), console_marker)
    position = health.queue_position(
        accepted.job_id
    )  # what the job page asks, for any signed-in user
    assert position.reachable
    assert broker.queued_job_ids() == []
    assert not console_marker.exists(), "a queue lookup unpickled a queue message"

    recover = subprocess.run(
        [sys.executable, "-m", "sluice.cli.main", "recover"],
        env=os.environ,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert recover.returncode == 0, recover.stderr
    assert not console_marker.exists(), "sluice recover unpickled a queue message"


def test_messages_are_json_that_carry_the_job_id(ctx, services):
    publishing.publish(41)
    [raw] = services.queue.client().lrange(f"huey.redis.{QUEUE_NAME}", 0, -1)
    assert raw.startswith(b"{")
    assert broker.queue_order() == [41]


def test_the_serializer_keeps_every_message_shape_and_refuses_anything_else():
    import datetime as dt

    from huey.registry import Message

    from sluice.pipeline.queueing.serializer import JsonSerializer, MessageError

    s = JsonSerializer()
    callback = Message(
        "c", "x.cb", None, 0, 0, None, (), {}, None, None, None, None, None, None, None
    )
    message = Message(
        "m",
        "sluice.process_job",
        dt.datetime(2026, 1, 2, 3, 4, 5),
        2,
        1.5,
        None,
        (7, "inst-1"),
        {"$odd": [1, (2, 3)], "n": None},
        callback,
        None,
        dt.timedelta(seconds=30),
        None,
        None,
        ("cid", 2, 0, callback),
        False,
    )
    assert s.deserialize(s.serialize(message)) == message
    assert s.deserialize(s.serialize((None, True))) == (None, True)  # a revocation record
    with pytest.raises(TypeError):
        s.serialize(Message("m", "t", args=(object(),)))
    for planted in (
        pickle.dumps(("x",)),
        b'{"$message": {"name": "t", "__reduce__": 1}}',
        b'{"$eval": "1"}',
    ):
        with pytest.raises(MessageError):
            s.deserialize(planted)
