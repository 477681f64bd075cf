"""The Huey instance, its tasks, and the periodic recovery. The consumer imports this module:

    huey_consumer pipeline.tasks.huey -k thread -w 2

Tasks are thin: they take a job id and call a plain function. Queue messages carry only the id;
the job database says what to do with it.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time

import redis
from huey import RedisHuey, crontab

from pipeline import recovery
from pipeline.context import get_context
from pipeline.runner import run_job
from storage.settings import get_settings

log = logging.getLogger("sluice.tasks")

_settings = get_settings()
_pool = redis.ConnectionPool.from_url(
    _settings.queue_redis_url, socket_connect_timeout=3, socket_timeout=10, health_check_interval=30
)
huey = RedisHuey(_settings.queue_name, results=False, utc=True, connection_pool=_pool)

WORKER_KEY = f"sluice.workers.{_settings.queue_name}"


@huey.task(name="sluice.process_job")
def process_job(job_id: int) -> None:
    run_job(int(job_id), ctx=get_context())


def publish(job_id: int) -> None:
    """Put one job id on the queue (raises when the queue Redis is unreachable)."""
    process_job(job_id)


def queue_order(limit: int | None = None) -> list[int]:
    """Job ids in the queue, the one that runs next first (the next ``limit`` at most)."""
    ids: list[int] = []
    for raw in huey.storage.enqueued_items(limit):  # huey returns them in the order they will run
        ids.extend(_job_id(raw))
    return ids


def queued_job_ids() -> list[int]:
    """Job ids waiting in the queue, next first, then those in the schedule."""
    ids = queue_order()
    for raw in huey.storage.scheduled_items():
        ids.extend(_job_id(raw))
    return ids


def _job_id(raw: bytes) -> list[int]:
    try:
        message = huey.serializer.deserialize(raw)
        return [int(message.args[0])] if message.args else []
    except Exception:
        return []


def queue_depth() -> dict[str, int]:
    return {"queued": huey.pending_count(), "scheduled": huey.scheduled_count()}


def workers_alive() -> list[dict]:
    client = huey.storage.conn
    out = []
    for key in client.scan_iter(match=f"{WORKER_KEY}:*", count=100):
        raw = client.get(key)
        if raw:
            try:
                out.append(json.loads(raw))
            except ValueError:
                continue
    return sorted(out, key=lambda w: w.get("id", ""))


def recover_once() -> recovery.RecoveryReport:
    return recovery.run_once(get_context(), publish=publish, queued_job_ids=queued_job_ids)


@huey.periodic_task(crontab(minute="*"), name="sluice.recover")
def recover() -> None:
    """Every minute, also when the sub-minute loop below is not running."""
    recover_once()


@huey.periodic_task(crontab(minute="*"), name="sluice.reconcile")
def periodic_reconcile() -> None:
    minutes = get_settings().reconcile_interval_minutes
    if minutes and int(time.time() // 60) % minutes == 0:
        from pipeline import reconcile

        reconcile.reconcile(get_context(), repair=True, actor="periodic reconcile")


_loop_started = False
_loop_lock = threading.Lock()


@huey.on_startup()
def start_recovery_loop() -> None:
    """One loop per consumer process: recovery every few seconds and a presence key for the console."""
    global _loop_started
    with _loop_lock:
        if _loop_started:
            return
        _loop_started = True
    _log_to_console()
    s = get_settings()
    log.info("worker %s: pipeline %s, embedder %s (%s), secrets set: %s", get_context().worker_id,
             get_context().pipeline_version, s.embedder, s.embed_precision,
             ", ".join(k for k, v in s.secrets_status().items() if v) or "none")
    threading.Thread(target=_recovery_loop, name="sluice-recovery", daemon=True).start()


def _log_to_console() -> None:
    """huey_consumer configures only the huey logger; show Sluice's own records the same way."""
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("[%(asctime)s] %(levelname)s:%(name)s:%(message)s"))
    level = os.environ.get("SLUICE_LOG_LEVEL", "INFO").upper()
    for name in ("pipeline", "storage", "sluice"):
        logger = logging.getLogger(name)
        if not logger.handlers:
            logger.addHandler(handler)
            logger.setLevel(level)
            logger.propagate = False


def _recovery_loop() -> None:
    ctx = get_context()
    interval = ctx.settings.recovery_interval_seconds
    me = {"id": ctx.worker_id, "host": socket.gethostname(), "pid": os.getpid(), "started": time.time()}
    while True:
        try:
            huey.storage.conn.set(f"{WORKER_KEY}:{ctx.worker_id}", json.dumps({**me, "seen": time.time()}),
                                  ex=max(15, int(interval * 3)))
        except redis.RedisError as exc:
            log.warning("queue Redis unreachable: %s", exc)
        try:
            report = recover_once()
            if report.anything:
                log.info("recovery: %s", report)
        except Exception as exc:  # never let the loop die; the next round tries again
            log.warning("recovery round failed: %s", exc)
        time.sleep(interval)
