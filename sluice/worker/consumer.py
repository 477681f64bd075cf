"""The worker process (``sluice serve worker``): Huey's consumer over the tasks in ``hooks``, with
an ordered stop. SIGTERM or SIGINT (honcho, ``sluice run``, Ctrl-C) stops it taking jobs, lets the
running ones finish within the grace, hands back what it still holds (``stopping``), then stops its
threads in order and exits 0; no traceback or abort for a stop asked for. A second signal cuts the
grace short."""

from __future__ import annotations

import argparse
import logging
import sys
import threading
import time
from collections.abc import Sequence

from huey.consumer import Consumer

from sluice.pipeline.running import embed, stopping
from sluice.pipeline.running.context import get_context
from sluice.worker import hooks

log = logging.getLogger("sluice.tasks")

DEFAULT_GRACE_SECONDS = 3.0  # under honcho's 5 s before SIGKILL, with room to hand back
THREADS_STOP_SECONDS = 0.5  # a job thread whose attempt was handed back ends within this


class OrderedConsumer(Consumer):
    """Every stop is the ordered one: stop taking jobs, wait the grace, hand back the rest; then
    the worker's loops and the export's child, the model's lanes (a batch still waiting for them
    fails, so its job thread ends its attempt, already handed back), and the job threads."""

    def stop(self, graceful: bool = False) -> None:
        if not stopping.requested():
            log.info("stopping: no new jobs; running ones get %ss", self.shutdown_timeout)
        stopping.request()
        super().stop(graceful=True)
        try:
            stopping.hand_back_all(get_context())
        except Exception as exc:  # the job database is gone too: the reaper takes them back
            log.warning("could not hand back the running jobs: %s", exc)
        left = hooks.stop_background() + embed.close_lanes()
        deadline = time.monotonic() + THREADS_STOP_SECONDS
        jobs = [t for _, t in self.worker_threads if isinstance(t, threading.Thread)]
        for thread in jobs:
            thread.join(max(0.0, deadline - time.monotonic()))
        left += [t.name for t in jobs if t.is_alive()]
        if left:
            log.warning("stopping: still running after the stop: %s", ", ".join(left))


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="sluice serve worker", description=__doc__)
    p.add_argument("-w", "--workers", type=int, default=2)
    p.add_argument("-k", "--kind", choices=["thread", "process", "greenlet"], default="thread")
    p.add_argument("-d", "--delay", type=float, default=0.1)
    p.add_argument("--grace", type=float, default=DEFAULT_GRACE_SECONDS)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("[%(asctime)s] %(levelname)s:%(name)s:%(message)s"))
    huey_log = logging.getLogger("huey")
    huey_log.addHandler(handler)
    huey_log.setLevel(logging.INFO)
    consumer = OrderedConsumer(
        hooks.huey,
        workers=args.workers,
        worker_type=args.kind,
        initial_delay=args.delay,
        shutdown_timeout=args.grace,
    )
    consumer.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
