"""Following sources from the workers: each recovery round starts the syncs that are due (those
added with ``--every`` whose first sync was confirmed), each in a thread of its own so a long
listing never holds the round, and removes for good what was tombstoned longer than
SLUICE_SYNC_TOMBSTONE_HOURS. A confirmed folder source on this worker's host is also watched
(watchfiles, debounced): a change syncs it within seconds, and the periodic full listing stays
the safety net for a missed event.

One change of a source runs at a time across the fleet: every worker may start a sync, the lease
lets one through (``sluice.ops.sources.leases``); the purge takes each source's lease too. The
recovery round calls ``follow_round`` by name (``sluice.pipeline.queueing.recovery.EXTRA_ROUNDS``):
the pipeline imports nothing of ops.
"""

from __future__ import annotations

import logging
import os
import threading
import time

from sqlmodel import Session, col, select

from sluice.ops.sources import syncing
from sluice.pipeline.queueing.publishing import publish
from sluice.pipeline.running.context import Context
from sluice.storage.clock import as_utc, db_now
from sluice.storage.source_records import Source

log = logging.getLogger(__name__)

PURGE_EVERY_SECONDS = 600.0
DEBOUNCE_MS = 1600
_lock = threading.Lock()
_running: dict[str, threading.Thread] = {}
_watching: dict[str, threading.Event] = {}
_last_purge = 0.0
errors: list[BaseException] = []  # what a follow thread raised (the tests look; the log says it)


def follow_round(ctx: Context) -> str:
    """Start the due syncs and the folder watchers; purge expired tombstones now and then."""
    global _last_purge
    with Session(ctx.engine) as session:
        now = db_now(session)
        following = session.exec(
            select(Source).where(
                col(Source.every_seconds).is_not(None), col(Source.unconfirmed_since).is_(None)
            )
        ).all()
    due = [s.name for s in following if s.next_run_at is None or as_utc(s.next_run_at) <= now]
    started = [name for name in due if _start(ctx, name, actor="schedule")]
    _watch(ctx, [s for s in following if s.kind == "folder" and os.path.isdir(s.location)])
    if time.monotonic() - _last_purge > PURGE_EVERY_SECONDS:
        _last_purge = time.monotonic()
        syncing.purge_expired(ctx)
    return f"sources: started {', '.join(started)}" if started else ""


def _start(ctx: Context, name: str, *, actor: str) -> bool:
    """A sync of ``name`` in a thread, unless this process runs one already."""
    with _lock:
        if name in _running and _running[name].is_alive():
            return False
        t = threading.Thread(
            target=_sync, args=(ctx, name, actor), name=f"sluice-sync-{name}", daemon=True
        )
        _running[name] = t
    t.start()
    return True


def _sync(ctx: Context, name: str, actor: str) -> None:
    try:
        result = syncing.sync(ctx, name, actor=actor, publish=publish)
        if result.ran:
            log.info("source %s: %s", name, result.message)
    except syncing.UnknownSource:  # removed meanwhile
        pass
    except Exception as exc:  # surfaced in the log (and to tests); the next round tries again
        errors.append(exc)
        log.warning("sync of source %s failed: %s: %s", name, type(exc).__name__, exc)


def _watch(ctx: Context, folders: list[Source]) -> None:
    names = {s.name for s in folders}
    with _lock:
        for name in [n for n in _watching if n not in names]:  # removed, or not followed now
            _watching.pop(name).set()
        new = [s for s in folders if s.name not in _watching]
        for src in new:
            _watching[src.name] = threading.Event()
    for src in new:
        threading.Thread(
            target=_watcher,
            args=(ctx, src.name, src.location, _watching[src.name]),
            name=f"sluice-watch-{src.name}",
            daemon=True,
        ).start()


def _watcher(ctx: Context, name: str, location: str, stop: threading.Event) -> None:
    """Sync the source after each debounced burst of changes in its folder."""
    try:
        import watchfiles

        for _changes in watchfiles.watch(
            location, debounce=DEBOUNCE_MS, stop_event=stop, recursive=True
        ):
            _start(ctx, name, actor="watch")
    except Exception as exc:  # the periodic listing goes on; the log says why the watch stopped
        errors.append(exc)
        log.warning("watching source %s (%s) stopped: %s", name, location, exc)
    finally:
        with _lock:
            if _watching.get(name) is stop:
                _watching.pop(name)


def stop_watching() -> None:
    """Stop every watcher of this process (tests; a stopping worker)."""
    with _lock:
        for event in _watching.values():
            event.set()
        _watching.clear()
