"""Reconcile at scale: one dataset of 200,000 chunks (200 documents of 1,000, tiny synthetic
vectors: the audit reads ids and metadata only), with a few problems among them, walked once as it
runs and once under tracemalloc for its peak memory; then 5 documents changed through Sluice's own
operation (their metadata replaced) and an incremental pass timed (``reconcile --changed``, target
under 10 s whatever the size of the store).

    python -m bench.reconcile_scale [--documents 200] [--chunks-each 1000] [--out BENCHMARKS.md]

Queue and cache Redis, a Chroma server and a SQLite job database on this machine (bench.system).
The target: a traced peak under 32 MB, where loading every id with its metadata at once would take
well over 100 MB. The suite walks the same 200,000 chunks and asserts a bound of one page
(tests/test_reconcile.py); the time is this bench's. With ``--out`` the table replaces the
"Reconcile at scale" section.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from bench.report import load_average, write_section
from bench.system import Services, clean_environment
from tests.support.big_store import ALIENS, MISSING

TITLE = "## Reconcile at scale"
BOUND_MB = 32  # the traced peak's target at 200,000 chunks
INCREMENTAL_S = 10.0  # the incremental pass's target (issue 43: at 1,000,000 chunks)
CHANGED = 5  # documents changed before the incremental pass


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def measure(documents: int, chunks_each: int) -> dict:
    from sluice.pipeline.reconcile.audit import reconcile
    from tests.support.big_store import add_problems, synthetic_store, traced_reconcile

    total = documents * chunks_each
    with Services() as services:
        services.configure("reconcile", SLUICE_EMBEDDER="hash")
        ctx = services.context()
        log(f"building a store of {total:,} chunks")
        started = time.perf_counter()
        name, made = synthetic_store(ctx, documents=documents, chunks_each=chunks_each)
        add_problems(ctx, name)
        built = time.perf_counter() - started

        log("walking it (untraced)")
        started = time.perf_counter()
        plain = reconcile(ctx, dataset="big", save=False)
        seconds = time.perf_counter() - started
        log("walking it again under tracemalloc")
        traced = traced_reconcile(ctx, "big")
        incremental = changed_pass(ctx, made, documents)
        ctx.vectors.drop_collection(name)

    for report in (plain, traced.report):
        [summary] = report.datasets
        found = (report.missing, report.orphans, report.mismatched)
        if summary.chunks != total - MISSING + ALIENS or found != (MISSING, ALIENS, 0):
            raise SystemExit(f"the audit found {found} in {summary.chunks} chunks: wrong")
    [summary] = traced.report.datasets
    return {
        "chunks": summary.chunks,
        "pages": summary.pages,
        "built_s": built,
        "seconds": seconds,
        "traced_s": traced.seconds,
        "peak_mb": traced.peak / 1024 / 1024,
        **incremental,
    }


def changed_pass(ctx, made: list, documents: int) -> dict:
    """The checkpoint a repairing full pass leaves (one is not run: this store has no word index,
    whose repair would rebuild every document), ``CHANGED`` documents' metadata replaced through
    Sluice's own operation (document 7, whose chunks ``add_problems`` took, among them), and a dry
    incremental pass timed: it must find those chunks missing and read nothing else."""
    from sqlmodel import Session

    from sluice.ops.metadata import set_document_metadata
    from sluice.pipeline.reconcile.audit import reconcile
    from sluice.pipeline.reconcile.changes import fingerprint
    from sluice.pipeline.reconcile.snapshot import Snapshot
    from sluice.storage import reconcile_checkpoints
    from sluice.storage.models import Dataset

    made = sorted(made, key=lambda j: j.id)  # document d's job is the d-th made
    dataset_id = made[0].dataset_id
    with Session(ctx.engine) as session:
        collection = session.get(Dataset, dataset_id).collection
        snap = Snapshot(session, dataset_id)
        reconcile_checkpoints.save(
            session, dataset_id, collection, fingerprint(snap), full=True, actor="bench"
        )
    step = max(1, documents // CHANGED)
    picked = sorted({7 % documents, *range(0, documents, step)})[:CHANGED]
    log(f"changing {len(picked)} documents' metadata, then an incremental pass")
    for d in picked:
        set_document_metadata(ctx, made[d].document_id, {"bench": "changed"}, actor="bench")
    started = time.perf_counter()
    report = reconcile(ctx, dataset="big", save=False, changed_only=True)
    seconds = time.perf_counter() - started
    [summary] = report.datasets
    found = (summary.kind, summary.jobs_checked, report.missing, report.orphans, report.mismatched)
    if found != ("incremental", len(picked), MISSING, 0, 0):
        raise SystemExit(f"the incremental pass found (kind, jobs, missing, ...) {found}: wrong")
    return {
        "changed": len(picked),
        "incremental_s": seconds,
        "ids_asked": summary.ids_asked,
        "incremental_chunks": summary.chunks,
    }


def section(figures: dict, documents: int, chunks_each: int, load: tuple[str, str]) -> str:
    met = "met" if figures["peak_mb"] < BOUND_MB else "**missed**"
    quick = "met" if figures["incremental_s"] < INCREMENTAL_S else "**missed**"
    rows = [
        ("store built (database rows, then chunks added to Chroma)", f"{figures['built_s']:.1f} s"),
        ("reconcile walk, dry run", f"{figures['seconds']:.1f} s"),
        ("... in chunks/s", f"{figures['chunks'] / figures['seconds']:,.0f}"),
        ("the same walk under tracemalloc", f"{figures['traced_s']:.1f} s"),
    ]
    lines = [
        TITLE,
        "",
        f"`python -m bench.reconcile_scale --documents {documents} --chunks-each {chunks_each}`: "
        f"{figures['chunks']:,} chunks in {figures['pages']} pages ({MISSING} missing, {ALIENS} "
        "foreign), one dataset on a Chroma server, SQLite job database; load average "
        f"{load[0]} at start, {load[1]} at end (1/5/15 min).",
        "",
        "| figure | value | target | |",
        "| --- | --- | --- | --- |",
        *[f"| {what} | {value} | | |" for what, value in rows],
        f"| peak traced memory of the walk | {figures['peak_mb']:.1f} MB | < {BOUND_MB} MB "
        f"| {met} |",
        f"| incremental pass, {figures['changed']} documents changed (dry run) "
        f"| {figures['incremental_s']:.2f} s | < {INCREMENTAL_S:.0f} s | {quick} |",
        f"| ... ids asked of Chroma (chunks found) | {figures['ids_asked']:,} "
        f"({figures['incremental_chunks']:,}) | | |",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.reconcile_scale")
    parser.add_argument("--documents", type=int, default=200)
    parser.add_argument("--chunks-each", type=int, default=1000)
    parser.add_argument("--out", type=Path, help="Markdown file whose section to replace")
    args = parser.parse_args(argv)
    clean_environment()
    load_start = load_average()
    figures = measure(args.documents, args.chunks_each)
    text = section(figures, args.documents, args.chunks_each, (load_start, load_average()))
    print(text)
    if args.out:
        write_section(args.out, TITLE, text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
