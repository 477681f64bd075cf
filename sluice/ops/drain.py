"""When will the queue drain? Work left, divided by the rate the workers reach while they are busy.

The rate is chunks finished per second of *busy* time over the last hour: the union of the
intervals in which at least one attempt ran (from its claim to its success), so idle stretches do
not dilute it and jobs that ran side by side are not counted twice. Work left is counted in chunks:
exact for jobs already embedding, estimated from the document's size for the rest (at the chunks
per byte the finished jobs showed). How sure the estimate is follows from how much it stands on.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

EMBEDDING_STAGES = ("embedding", "indexing")


@dataclass(frozen=True)
class DrainEstimate:
    active: int
    remaining_chunks: float
    chunks_per_second: float | None  # while busy
    busy_seconds: float
    basis_jobs: int  # finished jobs the rate stands on
    paused: str = ""  # the pause that holds this work ("": none): nothing waiting starts meanwhile

    @property
    def eta(self) -> timedelta | None:
        if self.active == 0:
            return timedelta(0)
        if self.paused or not self.chunks_per_second:
            return None
        return timedelta(seconds=self.remaining_chunks / self.chunks_per_second)

    @property
    def confidence(self) -> str:
        """good, fair or rough: how much measured work the rate stands on."""
        if self.basis_jobs >= 20 and self.busy_seconds >= 60:
            return "good"
        if self.basis_jobs >= 5:
            return "fair"
        return "rough"

    def describe(self) -> str:
        if self.active == 0:
            return "nothing is waiting"
        if self.paused:
            return (
                f"{self.active:,} active, but {self.paused}: no waiting job starts "
                "until it is resumed, so there is no drain time"
            )
        if self.chunks_per_second is None:
            return (
                f"{self.active:,} active; no job finished in the last hour, so there is no rate to "
                "estimate from yet"
            )
        return (
            f"{self.active:,} active, about {self.remaining_chunks:,.0f} chunks left at "
            f"{self.chunks_per_second:,.1f} chunks/s while busy ({self.basis_jobs} job(s) measured "
            f"over {self.busy_seconds:,.0f} s of busy time; {self.confidence} estimate)"
        )


def busy_seconds(intervals: list[tuple[datetime, datetime]]) -> float:
    """Length of the union of the intervals (when at least one attempt ran)."""
    total, end = 0.0, None
    for start, finish in sorted(i for i in intervals if i[0] and i[1] and i[1] >= i[0]):
        if end is None or start > end:
            total += (finish - start).total_seconds()
            end = finish
        elif finish > end:
            total += (finish - end).total_seconds()
            end = finish
    return total


@dataclass(frozen=True)
class WorkLeft:
    """What the active jobs have left, summed: exact chunks for jobs already embedding (or indexing:
    embedded already, nothing left), and the jobs and bytes whose chunks are not known yet."""

    jobs: int = 0
    chunks: int = 0
    unknown_jobs: int = 0
    unknown_bytes: int = 0

    @classmethod
    def of(cls, active: list[tuple]) -> WorkLeft:
        """From (stage, done, total, bytes) per active job: the rule the database sums the same way
        (``sluice.storage.queries.remaining_work``)."""
        chunks = unknown_jobs = unknown_bytes = 0
        for stage, done, total, size in active:
            if stage in EMBEDDING_STAGES and total:
                chunks += max(0, total - done) if stage == "embedding" else 0
            else:
                unknown_jobs += 1
                unknown_bytes += size or 0
        return cls(len(active), chunks, unknown_jobs, unknown_bytes)


@dataclass(frozen=True)
class _Rates:
    busy: float
    rate: float | None  # chunks per second while busy
    per_byte: float | None
    per_job: float

    @classmethod
    def of(cls, finished: list[tuple]) -> _Rates:
        done_chunks = sum(c or 0 for _, _, c, _ in finished)
        done_bytes = sum(b or 0 for _, _, _, b in finished)
        busy = busy_seconds([(s, f) for s, f, _, _ in finished])
        return cls(
            busy=busy,
            rate=done_chunks / busy if busy > 0 and done_chunks else None,
            per_byte=done_chunks / done_bytes if done_bytes else None,
            per_job=done_chunks / len(finished) if finished else 0.0,
        )

    def chunks(self, work: WorkLeft) -> float:
        """The chunks ``work`` has left: exact where known, estimated from its bytes (or jobs)."""
        if self.per_byte:
            return work.chunks + work.unknown_bytes * self.per_byte
        return work.chunks + work.unknown_jobs * self.per_job


def estimate(*, finished: list[tuple], active: WorkLeft, paused: str = "") -> DrainEstimate:
    """``finished``: (start, finish, chunks, bytes) of recent successes; ``active``: the work left;
    ``paused``: the pause that holds it, if any."""
    rates = _Rates.of(finished)
    rate, busy = rates.rate, rates.busy
    unknown = rates.chunks(active) - active.chunks
    return DrainEstimate(
        active=active.jobs,
        remaining_chunks=active.chunks + unknown,
        chunks_per_second=rate,
        busy_seconds=busy,
        basis_jobs=len(finished),
        paused=paused,
    )
