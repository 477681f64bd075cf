"""A Huey instance with one no-op task: Huey's own task rate, for comparison with Sluice's jobs.

    huey_consumer bench.noop_huey.huey -k thread -w 2

The queue Redis URL and queue name come from BENCH_NOOP_REDIS_URL and BENCH_NOOP_QUEUE.
"""

from __future__ import annotations

import os

from huey import RedisHuey

huey = RedisHuey(
    os.environ.get("BENCH_NOOP_QUEUE", "bench-noop"),
    results=False,
    utc=True,
    url=os.environ.get("BENCH_NOOP_REDIS_URL", "redis://127.0.0.1:6390/0"),
)


@huey.task(name="bench.noop")
def noop(i: int) -> None:
    return None
