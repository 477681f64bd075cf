"""What changed in a dataset since its last repairing reconcile, and the ids of the jobs that did,
asked of a store directly: the incremental pass (``reconcile --changed``).

The checkpoint (sluice.storage.reconcile_checkpoints) holds, per prefix of chunk ids, a digest of
the job as that pass judged it (``digest``) and its chunk count. A job of a new snapshot changed
when its digest differs or it is new, and a prefix of the checkpoint that no job makes now is gone;
every other job is as that pass found it, as far as Sluice's own changes go. A job in flight is
never judged: it is looked at once it has finished (its digest differs then).

The ids of a changed prefix are ``{prefix}{position:06d}``: every position below the larger of its
old and new chunk count is asked, then blocks of ``PROBE`` positions beyond while the last block
found any (a run that failed before it had a count leaves its first positions, written in order).
Chunks written or removed behind Sluice's back for a job that did not change, and foreign ids, are
what full passes are for.
"""

from __future__ import annotations

import hashlib
import json
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from sluice.pipeline.reconcile.snapshot import BATCH, IN_FLIGHT, PromisedJob, Snapshot
from sluice.storage.reconcile_checkpoints import Fingerprint

PROBE = 32  # positions asked past the largest count known, again while the last block found any

# id -> what the store holds for it (a chunk's metadata, a lexical row's fields); absent: not there
Found = dict[str, Any]


def digest(job: PromisedJob) -> bytes:
    """A short digest of everything reconcile judges a job's chunks by."""
    fields = json.dumps(job.fields or {}, sort_keys=True, default=str, separators=(",", ":"))
    key = (
        f"{job.id}|{job.row_version}|{job.status.value}|{job.active:d}|{job.live:d}|{job.kept:d}|"
        f"{job.chunk_count}|{fields}"
    )
    return hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=8).digest()


def fingerprint(snap: Snapshot, previous: Fingerprint | None = None) -> Fingerprint:
    """The checkpoint of a pass that judged from ``snap``. A job in flight was not judged: it keeps
    the larger chunk count the previous checkpoint knew, whose ids the next look must cover."""
    out: Fingerprint = {}
    for prefix, job in snap.by_prefix.items():
        count = job.chunk_count or 0
        if job.status in IN_FLIGHT and previous and prefix in previous:
            count = max(count, previous[prefix][1])
        out[prefix] = (digest(job), count)
    return out


@dataclass
class Changes:
    """The prefixes to read since a checkpoint: each with the positions below which every id is
    asked."""

    bounds: dict[str, int]
    jobs: int  # jobs of the snapshot
    gone: int  # prefixes of the checkpoint that no job makes now


def changed(snap: Snapshot, previous: Fingerprint) -> Changes:
    bounds: dict[str, int] = {}
    for prefix, job in snap.by_prefix.items():
        old = previous.get(prefix)
        if job.status in IN_FLIGHT or (old is not None and old[0] == digest(job)):
            continue
        bounds[prefix] = max(old[1] if old else 0, job.chunk_count or 0)
    gone = [p for p in previous if p not in snap.by_prefix]
    for prefix in gone:
        bounds[prefix] = previous[prefix][1]
    return Changes(bounds, len(snap.by_prefix), len(gone))


def ask_changed(
    bounds: dict[str, int], ask: Callable[[list[str]], Found], *, batch: int = BATCH
) -> Iterator[tuple[list[str], Found]]:
    """(ids asked, what the store holds of them), one request of at most ``batch`` ids at a time:
    every position below each prefix's bound, then ``PROBE`` more while the last block found any.
    Memory is one request's worth and a few numbers per changed prefix."""
    work: deque[tuple[str, int, int, bool]] = deque()  # prefix, start, end, probing
    for prefix, bound in bounds.items():
        if bound:
            work.append((prefix, 0, bound, False))
        work.append((prefix, bound, bound + PROBE, True))
    while work:
        ids: list[str] = []
        probes: list[tuple[str, int, int]] = []  # prefix, where its block starts in ids, its end
        while work and len(ids) < batch:
            prefix, start, end, probing = work[0]
            room = batch - len(ids)
            if probing and end - start > room and ids:
                break  # a block is asked whole, in the next request
            work.popleft()
            take = min(end - start, room) if not probing else end - start
            ids.extend(f"{prefix}{pos:06d}" for pos in range(start, start + take))
            if start + take < end:
                work.appendleft((prefix, start + take, end, probing))
            elif probing:
                probes.append((prefix, len(ids) - take, end))
        found = ask(ids)
        for prefix, at, end in probes:
            if any(cid in found for cid in ids[at : at + PROBE]):
                work.append((prefix, end, end + PROBE, True))
        yield ids, found
