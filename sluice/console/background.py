"""Work the console runs beside its script thread: one reconcile at a time per console process."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)


class Background:
    """Runs one reconcile at a time in a thread, for the console (whose script thread must stay
    quick), and keeps the outcome of the last one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.started_at: float | None = None
        self.label = ""
        self.report: dict[str, Any] | None = None
        self.error: str | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def seconds_running(self) -> float:
        """Since the last run started (0 before any)."""
        return time.time() - self.started_at if self.started_at is not None else 0.0

    def start(self, fn: Callable[[], Any], *, label: str) -> bool:
        """Start ``fn`` unless a run is under way; False when one is."""
        with self._lock:
            if self.running:
                return False
            self.label, self.started_at, self.error = label, time.time(), None
            self._thread = threading.Thread(
                target=self._run, args=(fn,), name="sluice-reconcile", daemon=True
            )
            self._thread.start()
            return True

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            self.report = fn().to_dict()
        except Exception as exc:
            log.exception("reconcile in the background failed")
            self.error = f"{type(exc).__name__}: {exc}"

    def wait(self, timeout: float | None = None) -> None:
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
