"""The Huey instance, publishing the outbox through a given function, and what the queue holds.

Transitions that queue work write an outbox row in their own transaction; whoever made them then
publishes the outbox once (``dispatch_now``, given the function that publishes one job: the
worker's task, through ``publishing``; this module never imports the task, so there is no cycle).
When the queue Redis is down, or refuses the password, the action still succeeds: the workers'
recovery loop publishes the rows when the queue is back. Every front end words that the same
way, through ``queue_note``.

Built on first use, not at import: importing this module reads no settings and opens no
connection, so a console page or a CLI command that never touches the queue never needs it.
The consumer's entry point is ``sluice.worker.hooks.huey``, the same instance.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable

import redis
from huey import RedisHuey
from sqlalchemy.engine import Engine

from sluice.errors import is_auth_error
from sluice.pipeline.queueing.serializer import JsonSerializer
from sluice.settings import get_settings
from sluice.storage.outbox import DispatchResult, dispatch

WINDOW_RECOUNT_SECONDS = 3.0
_READER = (
    JsonSerializer()
)  # what queue inspection reads entries with, whatever the instance was given


@functools.lru_cache(maxsize=1)
def get_huey() -> RedisHuey:
    """The process's Huey instance on the queue Redis named by the settings (built on first use)."""
    s = get_settings()
    pool = redis.ConnectionPool.from_url(
        s.queue_redis_url,
        password=s.redis_password("queue"),  # a password in the URL wins (it is the same one)
        socket_connect_timeout=3,
        socket_timeout=10,
        health_check_interval=30,
    )
    # JSON messages: reading the queue never unpickles what someone wrote into Redis.
    return RedisHuey(
        s.queue_name, results=False, utc=True, connection_pool=pool, serializer=JsonSerializer()
    )


def worker_key() -> str:
    """Prefix of the presence keys workers write into the queue Redis."""
    return f"sluice.workers.{get_settings().queue_name}"


def queue_note(error: str | None) -> str:
    """One sentence for an operator when publishing failed; empty when it did not."""
    if not error:
        return ""
    if is_auth_error(error):
        return (
            "the queue Redis refused the password (check SLUICE_QUEUE_REDIS_URL); the jobs are "
            "published as soon as the queue accepts it"
        )
    return f"queue unreachable ({error}); the workers publish the jobs as soon as it is back"


def dispatch_now(engine: Engine, *, via: Callable[[int], None]) -> tuple[DispatchResult, str]:
    """Publish due outbox rows now through ``via`` (``publishing.publish`` puts them on the queue);
    returns what was sent and the operator's note (empty when everything went)."""
    try:
        result = dispatch(engine=engine, publish=via, window=dispatch_window())
    except Exception as exc:  # the job database itself hiccuped; the workers publish later
        result = DispatchResult(error=f"{type(exc).__name__}: {exc}")
    return result, queue_note(result.error)


_threads_seen: list[float] = [
    0.0,
    1.0,
]  # when the worker threads alive were last counted, and how many


def dispatch_window() -> int:
    """How many messages the dispatcher keeps on the queue: SLUICE_DISPATCH_PER_THREAD for each
    worker thread alive (counted from the presence keys, at most every few seconds), 0 for no
    window."""
    per = get_settings().dispatch_per_thread
    if not per:
        return 0
    if time.monotonic() - _threads_seen[0] > WINDOW_RECOUNT_SECONDS:
        try:
            _threads_seen[1] = float(sum(int(w.get("threads") or 1) for w in workers_alive()))
        except redis.RedisError:
            pass  # keep the last count; the publish that follows says the queue is down
        _threads_seen[0] = time.monotonic()
    return per * max(1, int(_threads_seen[1]))


def queue_order(limit: int | None = None) -> list[int]:
    """Job ids in the queue, the one that runs next first (the next ``limit`` at most)."""
    huey = get_huey()
    ids: list[int] = []
    for raw in huey.storage.enqueued_items(limit):  # huey returns them in the order they will run
        ids.extend(_job_id(huey, raw))
    return ids


def queued_job_ids() -> list[int]:
    """Job ids waiting in the queue, next first, then those in the schedule."""
    huey = get_huey()
    ids = queue_order()
    for raw in huey.storage.scheduled_items():
        ids.extend(_job_id(huey, raw))
    return ids


def _job_id(huey: RedisHuey, raw: bytes) -> list[int]:
    """The job id of a message of this instance: data only, never code (a message of another
    instance on the same queue names a job of another database: it says nothing about ours)."""
    from sluice.pipeline.running.context import get_context

    try:
        message = _READER.deserialize(raw)
        if not message.args:
            return []
        owner = message.args[1] if len(message.args) > 1 else None
        if owner is not None and owner != get_context().instance_id:
            return []
        return [int(message.args[0])]
    except Exception:
        return []


def queue_depth() -> dict[str, int]:
    huey = get_huey()
    return {"queued": huey.pending_count(), "scheduled": huey.scheduled_count()}


def workers_alive() -> list[dict]:
    client = get_huey().storage.conn
    out = []
    for key in client.scan_iter(match=f"{worker_key()}:*", count=100):
        raw = client.get(key)
        if raw:
            try:
                out.append(json.loads(raw))
            except ValueError:
                continue
    return sorted(out, key=lambda w: w.get("id", ""))
