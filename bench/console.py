"""The console at scale: the queries behind the jobs page and the overview, on a database seeded
with many jobs (bulk inserts through tests/support/seed.py), on SQLite and, when
SLUICE_TEST_DATABASE_URL is set, on PostgreSQL.

Each query group runs as the console runs it (sluice.storage.queries in one fresh session, the same
calls as console/reads.py); the figure is p50 and p95 over many repetitions.
"""

from __future__ import annotations

import statistics
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

DATASETS = ("default", "contracts", "manuals", "research", "support")
PAGE_SIZE = 50


def seed(engine, jobs: int) -> dict[str, int]:
    from sqlmodel import Session

    from sluice.storage.queries import dataset_by_name
    from tests.support.seed import seed_jobs

    per = jobs // len(DATASETS)
    for n, name in enumerate(DATASETS):
        seed_jobs(engine, per if n else jobs - per * (len(DATASETS) - 1), dataset=name, seed=n)
    with Session(engine) as session:
        return {name: dataset_by_name(session=session, name=name).id for name in DATASETS}


def query_groups(datasets: dict[str, int], total: int) -> dict[str, Callable]:
    from sluice.storage import queries
    from sluice.storage.models import utcnow

    def page(f, number: int):
        def run(session):
            count = queries.count_jobs(session=session, f=f)
            rows = queries.list_jobs(
                session=session,
                f=f,
                sort="created",
                descending=True,
                page=number,
                page_size=PAGE_SIZE,
            )
            names = queries.dataset_names(session=session)
            return count, [
                {**queries.job_row(j), "dataset": names.get(j.dataset_id, "")} for j in rows
            ]

        return run

    def overview(session):  # what sluice.ops.reads.overview asks, in one session as it does
        now = utcnow()
        return (
            queries.status_counts(session=session),
            queries.oldest_waiting(session=session),
            queries.failures_by_kind(session=session),
            queries.throughput(session=session, minutes=60, now=now),
            queries.throughput(session=session, minutes=24 * 60, now=now, bucket_minutes=60),
            queries.recent_attempts(session=session, since=now - timedelta(minutes=60)),
            queries.remaining_work(session=session),
        )

    deep = max(1, (total // PAGE_SIZE) // 2)
    failed_in_one = queries.JobFilter(dataset_id=datasets["manuals"], statuses=["failed"])
    return {
        "jobs page 1": page(queries.JobFilter(), 1),
        "jobs page, filtered (dataset + failed)": page(failed_in_one, 1),
        "jobs page, name search": page(queries.JobFilter(name_contains="-0012"), 1),
        f"jobs page {deep} (deep)": page(queries.JobFilter(), deep),
        "overview": overview,
        "dead letters (groups)": lambda s: queries.dead_letter_groups(session=s),
        "datasets (system page)": lambda s: queries.dataset_summaries(session=s),
    }


def time_queries(engine, groups: dict[str, Callable], *, repeats: int) -> dict[str, dict]:
    from sqlmodel import Session

    out = {}
    for name, run in groups.items():
        samples = []
        for i in range(repeats + 1):
            t0 = time.perf_counter()
            with Session(engine, expire_on_commit=False) as session:
                run(session)
            if i:  # the first run warms caches, as a console that is already open has them
                samples.append((time.perf_counter() - t0) * 1000)
        samples.sort()
        out[name] = {
            "p50": statistics.median(samples),
            "p95": samples[min(len(samples) - 1, int(0.95 * len(samples)))],
            "max": samples[-1],
            "n": len(samples),
        }
    return out


def sqlite_figures(workdir: Path, *, jobs: int, repeats: int) -> dict:
    from sluice.storage import tallies
    from sluice.storage.db import get_engine

    url = f"sqlite:///{(workdir / f'console-{uuid.uuid4().hex[:6]}.db').resolve()}"
    engine = get_engine(url)
    t0 = time.perf_counter()
    datasets = seed(engine, jobs)
    seeded = time.perf_counter() - t0
    tallies.fold(engine)  # the worker's recovery round sums the counts' deltas every few seconds
    return {
        "seed_seconds": seeded,
        "queries": time_queries(engine, query_groups(datasets, jobs), repeats=repeats),
    }


def postgres_figures(base_url: str, *, jobs: int, repeats: int) -> dict:
    """On a throwaway database of the server at ``base_url``; dropped afterwards."""
    import psycopg
    from sqlalchemy.engine import make_url

    from sluice.storage import tallies
    from sluice.storage.db import get_engine, normalise_url

    url = make_url(normalise_url(base_url))
    name = f"sluice_bench_{uuid.uuid4().hex[:10]}"
    admin = url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    engine = None
    try:
        engine = get_engine(url.set(database=name).render_as_string(hide_password=False))
        t0 = time.perf_counter()
        datasets = seed(engine, jobs)
        seeded = time.perf_counter() - t0
        tallies.fold(engine)  # as the worker's recovery round does every few seconds
        # autovacuum would vacuum and analyse soon after a bulk load (and after the fold's delete
        # of every delta); do it now
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql("VACUUM ANALYZE")
        return {
            "seed_seconds": seeded,
            "queries": time_queries(engine, query_groups(datasets, jobs), repeats=repeats),
        }
    finally:
        if engine is not None:
            engine.dispose()
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


TITLE = "## The console at size"
PAGE_P95_MS = 100.0  # issue 43: every page's queries, p95


def section(figures: dict[str, dict], jobs: int, repeats: int, load: tuple[str, str]) -> str:
    """The table of every query group on each database measured, against the page target."""
    from bench.report import cpu_model

    lines = [
        TITLE,
        "",
        f"`python -m bench.console --jobs {jobs} --repeats {repeats}` "
        f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}): {jobs:,} jobs in five datasets "
        "(bulk-inserted in the seed's status mix), each page's queries as the console asks them, "
        f"in a fresh session, {repeats} runs after one warm-up. Machine: {cpu_model()}; load "
        f"average {load[0]} at start, {load[1]} at end (1/5/15 min).",
        "",
        "| query group | database | p50 ms | p95 ms | target | |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for database, measured in figures.items():
        if "error" in measured:
            lines.append(f"| (all) | {database} | | | | not measured: {measured['error']} |")
            continue
        for name, q in measured["queries"].items():
            met = "met" if q["p95"] < PAGE_P95_MS else "**missed**"
            lines.append(
                f"| {name} | {database} | {q['p50']:.1f} | {q['p95']:.1f} "
                f"| p95 < {PAGE_P95_MS:.0f} | {met} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """The console's queries at ``--jobs`` jobs (300,000 by default), SQLite and, when
    SLUICE_TEST_DATABASE_URL is set, PostgreSQL; with ``--out`` the section is replaced there."""
    import argparse
    import os
    import sys
    import tempfile

    from bench.report import load_average, write_section

    parser = argparse.ArgumentParser(prog="python -m bench.console")
    parser.add_argument("--jobs", type=int, default=300_000)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--out", type=Path, help="Markdown file whose section to replace")
    args = parser.parse_args(argv)
    start = load_average()
    figures: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="sluice-console-") as work:
        print(f"seeding {args.jobs:,} jobs on SQLite", file=sys.stderr)
        figures["SQLite"] = sqlite_figures(Path(work), jobs=args.jobs, repeats=args.repeats)
    pg = os.environ.get("SLUICE_TEST_DATABASE_URL")
    if pg:
        print(f"seeding {args.jobs:,} jobs on PostgreSQL", file=sys.stderr)
        try:
            figures["PostgreSQL"] = postgres_figures(pg, jobs=args.jobs, repeats=args.repeats)
        except Exception as exc:  # the server is down: say so in the table
            figures["PostgreSQL"] = {"error": f"{type(exc).__name__}: {exc}"}
    text = section(figures, args.jobs, args.repeats, (start, load_average()))
    print(text)
    if args.out:
        write_section(args.out, TITLE, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
