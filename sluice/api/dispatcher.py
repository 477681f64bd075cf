"""The API process's outbox dispatcher: a thread that puts uploaded jobs on the queue, so that an
upload answers right after its commit instead of after a round trip to the queue as well.

An upload commits its job with its outbox row, then wakes the thread. The thread publishes every
due row in one dispatch; uploads that commit while it runs wake it again, and its next round takes
them all, so concurrent uploads share rounds. Nothing relies on the thread for durability: a row
it did not publish (the process died first, the queue was down) is published by the workers'
recovery loop, as every unsent row is. Without a running thread (an app served without its
lifespan), ``wake`` dispatches in the caller, as uploads did before.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from sluice import faults

log = logging.getLogger(__name__)
STOP_SECONDS = 5.0


def _dispatch() -> None:
    """One dispatch of the outbox (the queue down: its rows wait for the next one, or recovery)."""
    from sluice.ops.ingest import dispatch_queued

    dispatch_queued()


class Dispatcher:
    """A thread that runs ``dispatch`` once after each ``wake`` (wakes during a round: one more)."""

    def __init__(self, dispatch: Callable[[], object] = _dispatch) -> None:
        self.dispatch = dispatch
        self.woken = threading.Event()
        self.stopping = threading.Event()
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        self.stopping.clear()
        self.woken.clear()
        self.thread = threading.Thread(target=self._run, name="sluice-dispatcher", daemon=True)
        self.thread.start()

    def running(self) -> bool:
        return self.thread is not None and self.thread.is_alive() and not self.stopping.is_set()

    def wake(self) -> None:
        """A job was committed with its outbox row: have it published."""
        if self.running():
            self.woken.set()
        else:
            self._round()

    def stop(self, timeout: float = STOP_SECONDS) -> None:
        """End the thread after a last round for the rows woken for (bounded: recovery has the
        rest)."""
        thread, self.thread = self.thread, None
        if thread is None:
            return
        self.stopping.set()
        self.woken.set()
        thread.join(timeout)

    def _run(self) -> None:
        while True:
            self.woken.wait()
            self.woken.clear()  # before the round: a commit from now on wakes the next one
            self._round()
            if self.stopping.is_set():
                return

    def _round(self) -> None:
        try:
            faults.hit("upload_dispatch")
            self.dispatch()
        except Exception:  # the rows stay unsent: the next round, or recovery, publishes them
            log.exception("the API's outbox dispatch failed; the rows wait for the next one")


dispatcher = Dispatcher()
"""The API process's one dispatcher (started and stopped by the application's lifespan)."""
