"""Syncing a folder source: the first sync of N files, a sync with nothing changed (the listing
and the comparison only: no file is read), and a sync with 100 changes (edits, renames, removals
and additions: the planning and recording part, then the embedding of what it queued with the
hash embedder).

    python -m bench.sources [--files 10000] [--changes 100] [--out BENCHMARKS.md]

Queue and cache Redis, a Chroma server and a SQLite job database on this machine (bench.system).
The table it writes goes to BENCHMARKS.md (``--out``).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from bench.report import load_average, write_section
from bench.system import Services

TITLE = "## Sources"


def _body(i: int, v: int = 0) -> bytes:
    return (f"File {i} of the share, version {v}: about subject s{i}v{v}. " * (8 + v)).encode()


def _last_job(ctx) -> int:
    from sqlmodel import Session, col, func, select

    from sluice.storage.models import Job

    with Session(ctx.engine) as session:
        return session.exec(select(func.max(col(Job.id)))).one() or 0


def _run_queued(ctx, after: int) -> int:
    """Run the pending jobs made after job ``after`` (the first sync's stay queued: not timed)."""
    from sqlmodel import Session, col, select

    from sluice.pipeline.running.runner import run_job
    from sluice.storage.models import Job, JobStatus

    with Session(ctx.engine) as session:
        ids = session.exec(
            select(Job.id).where(col(Job.status) == JobStatus.pending, col(Job.id) > after)
        ).all()
    for job_id in ids:
        run_job(job_id, ctx=ctx)
    return len(ids)


def _change(root: Path, files: int, changes: int) -> None:
    """``changes`` changes: a quarter each edits, renames, removals and additions."""
    q = changes // 4
    for i in range(q):
        (root / f"d{i % 100}" / f"f{i}.txt").write_bytes(_body(i, 1))
    for i in range(q, 2 * q):
        os.rename(root / f"d{i % 100}" / f"f{i}.txt", root / f"d{i % 100}" / f"moved{i}.txt")
    for i in range(2 * q, 3 * q):
        (root / f"d{i % 100}" / f"f{i}.txt").unlink()
    for i in range(changes - 3 * q):
        (root / "d0" / f"new{i}.txt").write_bytes(_body(files + i))


def measure(files: int, changes: int) -> list[tuple[str, str]]:
    from sluice.ops.sources import syncing

    rows = []
    with Services() as services, tempfile.TemporaryDirectory() as tmp:
        services.configure("sources", SLUICE_EMBEDDER="hash")
        ctx = services.context()
        root = Path(tmp) / "share"
        for i in range(files):
            folder = root / f"d{i % 100}"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"f{i}.txt").write_bytes(_body(i))
        syncing.add_source(ctx, name="share", dataset="bench", folder=str(root))
        t = time.perf_counter()
        first = syncing.sync(ctx, "share")
        rows.append((f"first sync of {files:,} files (read, hash, queue)", _s(t)))
        t = time.perf_counter()
        same = syncing.sync(ctx, "share")
        assert same.counts["unchanged"] == files, same.message
        rows.append((f"no-change sync of {files:,} files", _s(t)))
        _change(root, files, changes)
        before = _last_job(ctx)
        t = time.perf_counter()
        changed = syncing.sync(ctx, "share", confirm=True)
        rows.append((f"sync with {changes} changes: plan and record ({changed.message})", _s(t)))
        t = time.perf_counter()
        queued = _run_queued(ctx, before)
        rows.append((f"... then its {queued} jobs embedded (hash embedder, one thread)", _s(t)))
        print(f"first sync: {first.message}", file=sys.stderr)
    return rows


def _s(start: float) -> str:
    took = f"{time.perf_counter() - start:.2f} s"
    print(f"  ... {took}", file=sys.stderr, flush=True)  # each step as it ends
    return took


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.sources")
    p.add_argument("--files", type=int, default=10_000)
    p.add_argument("--changes", type=int, default=100)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    rows = measure(args.files, args.changes)
    lines = [
        TITLE,
        "",
        f"`python -m bench.sources --files {args.files} --changes {args.changes}`: a folder source "
        f"on local disk, SQLite job database; load average {load_average()} (1/5/15 min).",
        "",
        "| what | time |",
        "| --- | --- |",
        *[f"| {what} | {took} |" for what, took in rows],
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if args.out:
        write_section(args.out, TITLE, text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
