"""The Huey instance, publishing a job id, and reading what the queue holds.

Built on first use, not at import: importing this module reads no settings and opens no
connection, so a console page or a CLI command that never touches the queue never needs it.
The consumer's entry point is ``sluice.pipeline.tasks.huey``, the same instance.
"""

from __future__ import annotations

import json
import threading

import redis
from huey import RedisHuey

from sluice.storage.settings import get_settings

_huey: RedisHuey | None = None
_lock = threading.Lock()


def get_huey() -> RedisHuey:
    """The process's Huey instance on the queue Redis named by the settings."""
    global _huey
    with _lock:
        if _huey is None:
            s = get_settings()
            pool = redis.ConnectionPool.from_url(
                s.queue_redis_url, socket_connect_timeout=3, socket_timeout=10, health_check_interval=30
            )
            _huey = RedisHuey(s.queue_name, results=False, utc=True, connection_pool=pool)
        return _huey


def worker_key() -> str:
    """Prefix of the presence keys workers write into the queue Redis."""
    return f"sluice.workers.{get_settings().queue_name}"


def publish(job_id: int) -> None:
    """Put one job on the queue (raises when the queue Redis is unreachable).

    The message is plain data: the job id and the id of the job database it belongs to.
    """
    from sluice.pipeline.context import get_context
    from sluice.pipeline.tasks import process_job  # the task registers itself on the instance

    process_job(job_id, get_context().instance_id)


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
    """The job id of a message of this instance (a message of another instance on the same queue
    names a job of another database: it says nothing about ours)."""
    from sluice.pipeline.context import get_context

    try:
        message = huey.serializer.deserialize(raw)
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


def reset() -> None:
    """Forget the instance (tests that point the settings at another queue)."""
    global _huey
    with _lock:
        _huey = None
