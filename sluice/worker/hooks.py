"""The worker process's Huey instance as the consumer loads it: the task of
``sluice.pipeline.queueing.tasks``, the periodic tasks, and the start-up hook that runs the
recovery, webhook and model threads (``stop_background`` ends them as the worker stops).
``huey_consumer sluice.worker.hooks.huey`` (or ``sluice serve worker``, ``sluice.worker.consumer``)
imports this module."""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time

import redis
from huey import crontab

from sluice.files import use_private_umask
from sluice.ops.sources.follow import follow_round
from sluice.pipeline.queueing import recovery
from sluice.pipeline.queueing.broker import dispatch_now, worker_key
from sluice.pipeline.queueing.tasks import huey, process_job, publish
from sluice.pipeline.queueing.tasks import recover_once as recover_queue
from sluice.pipeline.running import embed, query_encoder, stopping
from sluice.pipeline.running.context import get_context
from sluice.settings import get_settings

__all__ = ["huey", "process_job", "publish"]

log = logging.getLogger("sluice.tasks")

# the consumer is a Sluice process: what it writes into the data dir stays private
use_private_umask()

ROUNDS: tuple[recovery.Round, ...] = (follow_round,)  # sources added with --every


def recover_once(hold: recovery.ReapHold | None = None) -> recovery.RecoveryReport:
    """One recovery round with the worker's own rounds (the sources it follows)."""
    return recover_queue(hold, rounds=ROUNDS)


@huey.periodic_task(crontab(minute="*"), name="sluice.recover")
def recover() -> None:
    """Every minute, also when the sub-minute loop below is not running."""
    recover_once()


@huey.periodic_task(crontab(minute="*"), name="sluice.reconcile")
def periodic_reconcile() -> None:
    """Every SLUICE_RECONCILE_INTERVAL_MINUTES: repair what changed since the last pass, and walk a
    dataset whole when its last full pass is older than SLUICE_RECONCILE_FULL_HOURS."""
    s = get_settings()
    minutes = s.reconcile_interval_minutes
    if minutes and int(time.time() // 60) % minutes == 0:
        from sluice.pipeline.reconcile import audit

        audit.reconcile(
            get_context(),
            repair=True,
            actor="periodic reconcile",
            changed_only=True,
            full_every_hours=s.reconcile_full_hours,
        )


@huey.periodic_task(crontab(minute="17", hour="3"), name="sluice.prune")
def periodic_prune() -> None:
    """Once a day: forget what SLUICE_RETENTION_DAYS allows (idempotent, so every consumer may run
    it)."""
    from datetime import timedelta

    from sqlmodel import Session

    from sluice.storage import idempotency_records, retention
    from sluice.storage.models import utcnow

    days = get_settings().retention_days
    if not days:  # keep everything, but the API's idempotency records, whose 24 hours are over
        with Session(get_context().engine) as session:
            idempotency_records.prune(session=session, dry_run=False)
        return
    with Session(get_context().engine) as session:
        report = retention.prune(
            session=session, cutoff=utcnow() - timedelta(days=days), dry_run=False
        )
    log.info("retention: %s", report.describe())


MIN_WAKE_SECONDS = 0.05  # the recovery loop's shortest wait for an outbox row coming due
_loop_started = False
_loop_lock = threading.Lock()
_threads = 0  # worker threads of this consumer that have started (huey runs the hook in each)
_stop = threading.Event()  # the recovery and webhook loops end their round and stop
_loops: list[threading.Thread] = []
_exporter = query_encoder.Exporter()


@huey.on_startup()
def start_recovery_loop() -> None:
    """One loop per consumer process: recovery every few seconds and a presence key for the
    console."""
    global _loop_started, _threads
    with _loop_lock:
        _threads += 1
        if _loop_started:
            return
        _loop_started = True
    _log_to_console()
    s = get_settings()
    log.info(
        "worker %s of instance %s: pipeline %s, embedder %s (%s), secrets set: %s",
        get_context().worker_id,
        get_context().instance_id,
        get_context().pipeline_version,
        s.embedder,
        s.embed_precision,
        ", ".join(k for k, v in s.secrets_status().items() if v) or "none",
    )
    _loops.extend(
        threading.Thread(target=loop, name=name, daemon=True)
        for loop, name in ((_recovery_loop, "sluice-recovery"), (_webhook_loop, "sluice-webhooks"))
    )
    for thread in _loops:
        thread.start()
    if s.embedder == "sentence-transformers":
        start_model_threads()


def stop_background(timeout: float = 2.0) -> list[str]:
    """The worker's own threads, stopped as the consumer stops: the export's child ended, the
    recovery and webhook loops after the round they are in, the presence key gone (the console and
    the API say at once that no worker is alive). Returns the names of threads still running."""
    _stop.set()
    recovery.ALARM.ring()  # the recovery loop waits on it
    _exporter.stop()
    deadline = time.monotonic() + timeout
    for thread in _loops:
        thread.join(max(0.0, deadline - time.monotonic()))
    if _loops:
        try:
            huey.storage.conn.delete(f"{worker_key()}:{get_context().worker_id}")
        except redis.RedisError as exc:  # it expires by itself within a few seconds
            log.warning("could not remove the presence key: %s", exc)
    return [t.name for t in _loops if t.is_alive()]


def start_model_threads() -> list[threading.Thread]:
    """Load the model and export the query encoder, each in a thread of its own, at once (their
    imports of transformers are serialised in the embed module)."""
    threads = [
        threading.Thread(target=_load_model, name="sluice-model", daemon=True),
        threading.Thread(target=_export_query_encoder, name="sluice-export", daemon=True),
    ]
    for thread in threads:
        thread.start()
    return threads


def _load_model() -> None:
    """Load the model as the worker starts, beside the first job's parsing instead of after it (a
    job asking for it meanwhile waits for this load, never starts a second one)."""
    try:
        get_context().embedder  # noqa: B018 - loads and keeps it
    except Exception as exc:  # the first job meets the same error, classified, on its own
        log.warning("could not load the embedding model at start: %s", exc)
    if stopping.requested():  # loaded after the stop closed the lanes: these stop too
        embed.close_lanes()


def _export_query_encoder() -> None:
    """Once per model and data directory: the ONNX export that makes a cold `sluice search` fast,
    in a child process at the lowest CPU priority (``query_encoder.Exporter``), unless it is made
    already."""
    from pathlib import Path

    s = get_settings()
    try:
        model_dir = Path(embed.model_path(s.embed_model))
        if not query_encoder.exportable(model_dir):
            return
        if query_encoder.export_path(model_dir, s.data_dir).exists():
            return
        _exporter.run(model_dir, s.data_dir)  # the child logs how it went
    except Exception as exc:  # search keeps working through the full model
        log.warning("could not export the query encoder: %s", exc)


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
    """A round every SLUICE_RECOVERY_INTERVAL_SECONDS (sooner when a held reaping comes due); in
    between, the outbox alone is published whenever a row of it comes due (a retry's backoff ends),
    so a retry waits its backoff, not the interval."""
    ctx = get_context()
    interval = ctx.settings.recovery_interval_seconds
    me = {
        "id": ctx.worker_id,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "started": time.time(),
        "instance": ctx.instance_id,
    }
    hold = (
        recovery.ReapHold()
    )  # the grace after a silence never stops the outbox or the presence key
    next_round = time.monotonic()
    while not _stop.is_set():
        if time.monotonic() >= next_round:
            _recovery_round(ctx, me, hold, interval)
            wait = min(interval, hold.remaining()) if hold.due is not None else interval
            next_round = time.monotonic() + wait
        else:
            _publish_due(ctx)
        recovery.ALARM.wait(_until_due(ctx, next_round - time.monotonic()))


def _recovery_round(ctx, me: dict, hold: recovery.ReapHold, interval: float) -> None:
    """The presence key for the console, then one recovery round (never raises)."""
    try:
        huey.storage.conn.set(
            f"{worker_key()}:{ctx.worker_id}",
            json.dumps({**me, "threads": _threads, "seen": time.time()}),
            ex=max(15, int(interval * 3)),
        )
    except redis.RedisError as exc:
        log.warning("queue Redis unreachable: %s", exc)
    try:
        report = recover_once(hold)
        if report.anything:
            log.info("recovery: %s", report)
    except Exception as exc:  # never let the loop die; the next round tries again
        log.warning("recovery round failed: %s", exc)


def _publish_due(ctx) -> None:
    """The outbox rows due now, between rounds (never raises: the next round tries again)."""
    try:
        result, _ = dispatch_now(ctx.engine, via=publish)
        if result.sent:
            log.info("recovery: published %s, due now", result.sent)
    except Exception as exc:
        log.warning("publishing the outbox failed: %s", exc)


def _until_due(ctx, seconds: float) -> float:
    """``seconds``, or less when an outbox row comes due sooner (never raises)."""
    try:
        due = recovery.next_due_in(ctx)
    except Exception as exc:  # the job database does not answer: the round's own wait
        log.debug("next outbox row not read: %s", exc)
        return seconds
    return seconds if due is None else min(seconds, max(due, MIN_WAKE_SECONDS))


def _webhook_loop() -> None:
    """Webhook deliveries, beside the recovery loop and at its pace, never in a job's way."""
    ctx = get_context()
    while not _stop.is_set():
        try:
            report = recovery.deliver_webhooks(ctx)
            if report.anything:
                log.info("webhooks: %s", report)
        except Exception as exc:  # never let the loop die; the next round tries again
            log.warning("webhook round failed: %s", exc)
        _stop.wait(ctx.settings.recovery_interval_seconds)
