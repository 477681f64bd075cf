"""The HTTP API under load: uploads by concurrent clients while a worker runs, a job's state at
100,000 jobs, and the delay from a job's success to its event on many open streams.

    python -m bench.api [--uploads 500] [--clients 8] [--jobs 100000] [--streams 50]
                        [--out BENCHMARKS.md] [--quick]

A real ``sluice serve api`` process (uvicorn, one process), a real huey_consumer (2 threads, hash
embedder), queue and cache Redis, a Chroma server and a SQLite job database, all on this machine.
With ``--out`` the table replaces the "HTTP API" section of that file.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import httpx

from bench.report import Table, load_average, write_section
from bench.system import Services, cpu_seconds, wait_final

TITLE = "## HTTP API"
STREAM_JOBS = 20  # jobs whose success the open streams wait for


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def _text(n: int) -> bytes:
    return (f"Upload {n}: the invoice {n:05d} of the bench is due in March. " * 12).encode()


def alone(url: str, token: str, *, total: int) -> list[float]:
    """Answer times of uploads one after another, nothing else running: what one costs."""
    times = []
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}) as c:
        for n in range(total):
            start = time.perf_counter()
            r = c.post(
                "/v1/datasets/alone/documents",
                files={"file": (f"a{n}.txt", _text(50_000 + n), "text/plain")},
                timeout=60,
            )
            times.append(time.perf_counter() - start)
            assert r.status_code == 202, r.text
    return times


def uploads(url: str, token: str, *, total: int, clients: int) -> dict:
    """``total`` small text files as multipart uploads by ``clients`` threads, each its own
    connection; every answer's time, and the accepted uploads per second of wall time."""
    times: list[float] = []
    codes: list[int] = []
    lock = threading.Lock()
    numbers = iter(range(total))

    def client() -> None:
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}) as c:
            while True:
                with lock:
                    n = next(numbers, None)
                if n is None:
                    return
                start = time.perf_counter()
                r = c.post(
                    "/v1/datasets/default/documents",
                    files={"file": (f"u{n}.txt", _text(n), "text/plain")},
                    timeout=60,
                )
                with lock:
                    times.append(time.perf_counter() - start)
                    codes.append(r.status_code)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    wall = time.perf_counter() - start
    accepted = codes.count(202)
    return {"times": times, "accepted": accepted, "wall": wall, "codes": sorted(set(codes))}


@dataclass
class Listener:
    """One open event stream: when each job's ``job.succeeded`` event arrived."""

    url: str
    token: str
    seen: dict[int, float] = field(default_factory=dict)
    ready: threading.Event = field(default_factory=threading.Event)

    def run(self, seconds: float) -> None:
        headers = {"Authorization": f"Bearer {self.token}"}
        try:
            with httpx.Client(base_url=self.url, timeout=seconds + 30) as c:
                with c.stream("GET", f"/v1/events?seconds={seconds}", headers=headers) as r:
                    self._read(r)
        except httpx.HTTPError:
            pass  # the API stopped at the end of the run; what arrived is what counts

    def _read(self, r: httpx.Response) -> None:
        kind = ""
        for line in r.iter_lines():
            self.ready.set()  # the first line ("retry:") means the cursor is open
            if line.startswith("event: "):
                kind = line[7:]
            elif line.startswith("data: ") and kind == "job.succeeded":
                self.seen[json.loads(line[6:])["job"]["id"]] = time.time()


def stream_delays(url: str, token: str, ctx, *, streams: int) -> dict:
    """``streams`` open streams; ``STREAM_JOBS`` uploads one after another; for each stream and job,
    the time from the success (the job's finish, by the database's clock on this host) to the
    moment the stream delivered its event."""
    from sqlmodel import Session, select

    from sluice.storage.clock import as_utc
    from sluice.storage.models import Job

    listeners = [Listener(url, token) for _ in range(streams)]
    threads = [threading.Thread(target=li.run, args=(90.0,), daemon=True) for li in listeners]
    for t in threads:
        t.start()
    for li in listeners:
        if not li.ready.wait(30):
            raise RuntimeError("an event stream did not open within 30 s")
    ids = []
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}) as c:
        for n in range(STREAM_JOBS):
            r = c.post(
                "/v1/datasets/default/documents",
                json={"filename": f"s{n}.txt", "text": _text(10_000 + n).decode()},
                timeout=60,
            )
            ids.append(r.json()["jobs"][0]["job_id"])
            time.sleep(0.25)
    wait_final(ctx, ids, timeout=120)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(len(li.seen) < len(ids) for li in listeners):
        time.sleep(0.1)
    with Session(ctx.engine) as session:
        finished = {
            j.id: as_utc(j.finished_at).timestamp()
            for j in session.exec(select(Job).where(Job.id.in_(ids))).all()
        }
    delays = [li.seen[i] - finished[i] for li in listeners for i in ids if i in li.seen]
    missing = sum(1 for li in listeners for i in ids if i not in li.seen)
    return {"delays": delays, "missing": missing, "jobs": len(ids)}


def seed_to(ctx, jobs: int) -> tuple[list, float]:
    """Bulk-insert jobs (tests/support/seed.py's mix) up to ``jobs``; (id, status) of every job,
    and the seconds it took."""
    from sqlalchemy import func
    from sqlmodel import Session, select

    from sluice.storage.models import Job
    from tests.support.seed import seed_jobs

    with Session(ctx.engine) as session:
        have = session.exec(select(func.count()).select_from(Job)).one()
    started = time.perf_counter()
    seed_jobs(ctx.engine, max(0, jobs - have), dataset="default", seed=7)
    seeded = time.perf_counter() - started
    with Session(ctx.engine) as session:
        return list(session.exec(select(Job.id, Job.status)).all()), seeded


def job_polls(url: str, token: str, rows: list, *, samples: int) -> dict[str, list[float]]:
    """``GET /v1/jobs/{id}`` of random ids, one client; the waiting ones (which compute their
    place in the queue) also apart."""
    from sluice.storage.models import JobStatus

    rng = random.Random(1)
    picked = rng.sample(rows, min(samples, len(rows)))
    pending = [r for r in rows if r[1] == JobStatus.pending]
    picked += rng.sample(pending, min(samples // 5, len(pending)))
    times: dict[str, list[float]] = {"all": [], "pending": []}
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}) as c:
        for job_id, _ in rows[:20]:  # warm the connection and the caches
            c.get(f"/v1/jobs/{job_id}")
        for n, (job_id, _) in enumerate(picked):
            start = time.perf_counter()
            r = c.get(f"/v1/jobs/{job_id}", timeout=30)
            spent = time.perf_counter() - start
            assert r.status_code == 200, r.text
            times["pending" if n >= samples else "all"].append(spent)
    return times


def _upload_rows(table: Table, args, one: list[float], up: dict, cpu: dict[str, float]) -> None:
    ms = [t * 1000 for t in up["times"]]
    sec = f"1. {args.uploads} uploads, {args.clients} clients, a worker running (ms)"
    table.add(
        sec,
        "one client alone, no worker: answer time p50",
        pct(one, 50),
        unit=" ms",
        note=f"50 uploads one after another; p95 {pct(one, 95):.1f} ms: what one costs",
    )
    table.add(
        sec,
        "API process CPU per upload, one client alone",
        cpu["alone"],
        unit=" ms",
        digits=2,
        note="user + system time of the API process; moves least with other work on the machine",
    )
    table.add(sec, "API process CPU per upload, the clients at once", cpu["clients"], unit=" ms")
    table.add(sec, "accepted per second", up["accepted"] / up["wall"], digits=1)
    table.add(sec, "answer time p50", pct(ms, 50), unit=" ms")
    table.add(
        sec,
        "answer time p95",
        pct(ms, 95),
        unit=" ms",
        target="p95 < 50",
        ok=lambda v: v < 50,
        note=f"{up['accepted']} of {args.uploads} answered 202 (codes {up['codes']})",
    )
    table.add(sec, "answer time p99", pct(ms, 99), unit=" ms")


def _stream_rows(table: Table, args, st: dict) -> None:
    ms = [d * 1000 for d in st["delays"]]
    sec = f"2. {args.streams} open event streams, {st['jobs']} jobs (ms)"
    table.add(sec, "success to its event, p50", pct(ms, 50), unit=" ms")
    table.add(
        sec,
        "success to its event, p95",
        pct(ms, 95),
        unit=" ms",
        target="p95 < 500",
        ok=lambda v: v < 500,
        note=f"{len(ms)} deliveries, {st['missing']} missing; max {max(ms):.0f} ms",
    )


def _poll_rows(table: Table, jobs: int, times: dict[str, list[float]], how: str) -> None:
    sec = f"3. GET /v1/jobs/{{id}} at {jobs:,} jobs, SQLite, {how} (ms)"
    every = [t * 1000 for t in times["all"]]
    waiting = [t * 1000 for t in times["pending"]]
    table.add(sec, "any job, p50", pct(every, 50), unit=" ms", digits=2)
    table.add(
        sec,
        "any job, p95",
        pct(every, 95),
        unit=" ms",
        digits=2,
        target="p95 < 10",
        ok=lambda v: v < 10,
        note=f"{len(every)} random ids (the seed's mix: 80% succeeded, 6% pending)",
    )
    if waiting:
        table.add(
            sec,
            "a pending job (its place in the queue), p95",
            pct(waiting, 95),
            unit=" ms",
            digits=2,
            note=f"{len(waiting)} pending ids; p50 {statistics.median(waiting):.2f} ms",
        )


def measure(args) -> tuple[Table, list[str]]:
    from sluice.ops import actions
    from sluice.ops.access import cli_operator
    from sluice.ops.keys import create_key
    from tests.support.api_server import ApiServer

    table, notes = Table(), []
    with Services() as svc:
        env = svc.configure(
            "api",
            SLUICE_EMBEDDER="hash",
            SLUICE_API_RATE_PER_MINUTE="0",
            SLUICE_LOG_LEVEL="WARNING",
        )
        ctx = svc.context()
        token = create_key(cli_operator(), "bench", datasets=None, scope="manage")[1]
        api = ApiServer(env, svc.workdir / "api.log")
        api.start()
        try:
            assert actions.create_dataset(cli_operator(), "alone")[0]
            started = cpu_seconds(api.pid)
            one = [t * 1000 for t in alone(api.url, token, total=50)]
            cpu = {"alone": 1000 * (cpu_seconds(api.pid) - started) / 50}
            worker = svc.start_worker(env, "api-worker", workers=2)
            started = cpu_seconds(api.pid)
            up = uploads(api.url, token, total=args.uploads, clients=args.clients)
            cpu["clients"] = 1000 * (cpu_seconds(api.pid) - started) / args.uploads
            _upload_rows(table, args, one, up, cpu)
            done = wait_final(ctx, _all_job_ids(ctx), timeout=600)
            notes.append(f"uploads: {done.statuses} once the worker was done")
            _stream_rows(table, args, stream_delays(api.url, token, ctx, streams=args.streams))
            svc.stop_worker(worker)  # seeded jobs are rows only: no worker may try them
            rows, seeded = seed_to(ctx, args.jobs)
            notes.append(f"seeding took {seeded:.0f} s")
            times = job_polls(api.url, token, rows, samples=args.samples)
            _poll_rows(table, len(rows), times, "the API process of the runs above")
            api.stop()
            api = ApiServer(env, svc.workdir / "api-fresh.log")
            api.start()
            notes.append(f"the bulk load's WAL: {_checkpoint(ctx) / 1e6:.0f} MB, checkpointed")
            times = job_polls(api.url, token, rows, samples=args.samples)
            _poll_rows(table, len(rows), times, "a fresh API process, WAL checkpointed")
        finally:
            api.stop()
    return table, notes


def _checkpoint(ctx) -> int:
    """Write SQLite's WAL back into the database file and empty it, as in a system that grew to
    its jobs over weeks (a bulk load leaves the WAL tens of MB long); its size before."""
    wal = Path(ctx.settings.data_dir) / "sluice.db-wal"
    size = wal.stat().st_size if wal.exists() else 0
    with ctx.engine.connect() as conn:
        conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
    return size


def _all_job_ids(ctx) -> list[int]:
    from sqlmodel import Session, select

    from sluice.storage.models import Job

    with Session(ctx.engine) as session:
        return list(session.exec(select(Job.id)).all())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--uploads", type=int, default=500)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--streams", type=int, default=50)
    parser.add_argument("--samples", type=int, default=500, help="GETs of random job ids")
    parser.add_argument("--quick", action="store_true", help="100 uploads, 10,000 jobs, 10 streams")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if args.quick:
        args.uploads, args.jobs, args.streams, args.samples = 100, 10_000, 10, 200
    started = datetime.now(UTC)
    before = load_average()
    t0 = time.monotonic()
    table, notes = measure(args)
    minutes = (time.monotonic() - t0) / 60
    print(table.text())
    for note in notes:
        print(note)
    if args.out:
        section = (
            f"{TITLE}\n\n`python -m bench.api` (`make bench` runs it after the table above). "
            f"Run: {started:%Y-%m-%d %H:%M} UTC ({minutes:.1f} min); load average (1/5/15 min) "
            f"{before} at the start, {load_average()} at the end. One `sluice serve api` process "
            "(uvicorn), one worker process with 2 threads and the hash embedder, SQLite, the "
            "Chroma server and both Redis servers on this 2-core machine.\n\n"
            f"{table.markdown()}\n"
        )
        write_section(args.out, TITLE, section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
