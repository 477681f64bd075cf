"""Cold start: from the command an operator types to the first useful result.

Worker: a job is queued, then ``sluice serve worker`` starts in a fresh data directory; the clock
stops when Chroma holds the job's first chunk (its first batch embedded and stored). Console:
``sluice serve console`` starts; the clock stops when its health endpoint answers, and when the
Overview page has been drawn in Chromium (launched before the clock starts; Debian's package, as
the browser test uses it). Without Chromium the second figure is left out, and the table says why.
Search: ``sluice search QUERY`` in a new process, with the query encoder the worker exports; the
clock stops when the process has printed its first hit and exited (its CPU seconds are kept too).
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from bench.system import Services
from tests.support.servers import ManagedProcess, free_port

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
POLL = 0.02


def _sluice(*args: str) -> list[str]:
    exe = Path(sys.executable).with_name("sluice")
    return [str(exe), *args] if exe.exists() else [sys.executable, "-m", "sluice.cli.main", *args]


def _start(svc: Services, what: str, name: str, env: dict) -> tuple[ManagedProcess, float]:
    proc = ManagedProcess(_sluice("serve", what), log=svc.workdir / f"{name}-{what}.log", env=env)
    t0 = time.monotonic()
    proc.start()
    return proc, t0


def _until(proc: ManagedProcess, t0: float, timeout: float, done, what: str) -> float:
    """Seconds from ``t0`` until ``done()``; fails when the process dies or ``timeout`` passes."""
    while not done():
        if time.monotonic() > t0 + timeout or not proc.alive():
            raise RuntimeError(f"{what} within {timeout}s:\n{proc.output()[-3000:]}")
        time.sleep(POLL)
    return time.monotonic() - t0


def worker_first_chunk(svc: Services, *, name: str, timeout: float = 300) -> dict:
    from sluice.ops.ingest import ingest_bytes
    from sluice.pipeline.queueing.publishing import publish

    env = svc.configure(f"{name}-worker", SLUICE_EMBED_PRECISION="auto")
    ctx = svc.context()
    text = " ".join(
        f"Cold start sentence {i} about harbour cranes and the tide tables." for i in range(400)
    )
    r = ingest_bytes(ctx, text.encode(), dataset="cold", filename="cold.txt", publish=publish)
    if not r.published:
        raise RuntimeError(f"the cold-start job was not queued: {r.message}")
    from sqlmodel import Session, select

    from sluice.storage.models import Dataset

    with Session(ctx.engine) as session:
        collection = session.exec(select(Dataset).where(Dataset.name == "cold")).one().collection
    queue = svc.queue.client()
    pattern = f"sluice.workers.{env['SLUICE_QUEUE_NAME']}:*"
    proc, t0 = _start(svc, "worker", name, env)
    ready = None

    def first_chunk() -> bool:
        nonlocal ready
        if ready is None and next(queue.scan_iter(match=pattern), None) is not None:
            ready = time.monotonic() - t0
        try:
            return ctx.vectors.count(collection) > 0
        except Exception:  # the collection is made by the worker's first write
            return False

    try:
        first = _until(proc, t0, timeout, first_chunk, "no chunk in Chroma")
    finally:
        proc.stop()
    return {
        "first_chunk_s": first,
        "ready_s": ready if ready is not None else first,
        "note": "the model starts loading with the worker, beside the first job's parsing; the "
        "query encoder export a new data directory needs runs at the lowest CPU priority",
    }


def console_first_page(svc: Services, *, name: str, timeout: float = 120) -> dict:
    env = svc.configure(f"{name}-console")
    port = free_port()
    env = {**env, "SLUICE_CONSOLE_PORT": str(port), "SLUICE_CONSOLE_ADDRESS": "127.0.0.1"}
    env["SLUICE_CONSOLE_SIGN_IN"] = "off"  # the first page drawn, not the one-time local link
    url = f"http://127.0.0.1:{port}"
    browser = playwright = None
    note = ""
    if Path(CHROMIUM).exists():
        try:
            from playwright.sync_api import sync_playwright

            playwright = sync_playwright().start()
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        except Exception as exc:  # no playwright: the health figure alone
            note = f"first page not measured: {type(exc).__name__}: {exc}"
    else:
        note = f"first page not measured: {CHROMIUM} is missing (`make browser`)"
    proc, t0 = _start(svc, "console", name, env)
    drawn = None

    def healthy() -> bool:
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as resp:
                return resp.status == 200
        except OSError:
            return False

    try:
        health = _until(proc, t0, timeout, healthy, "the console's health endpoint did not answer")
        if browser is not None:
            page = browser.new_page()
            page.goto(url)
            page.get_by_role("heading", name="Overview", exact=True).wait_for(
                timeout=timeout * 1000
            )
            drawn = time.monotonic() - t0
            page.close()
    finally:
        proc.stop()
        if browser is not None:
            browser.close()
        if playwright is not None:
            playwright.stop()
    out = {"health_s": health, "drawn_s": drawn}
    if note:
        out["note"] = note
    return out


def cold_search(svc: Services, *, name: str, runs: int = 5, timeout: float = 120) -> dict:
    """Seconds of ``runs`` cold ``sluice search`` processes, each to its first hit (real model,
    the query encoder exported as a worker exports it at its start)."""
    from sluice.ops.ingest import ingest_bytes
    from sluice.pipeline.running import query_encoder
    from sluice.pipeline.running.embed import model_path
    from sluice.pipeline.running.runner import run_job

    env = svc.configure(f"{name}-search", SLUICE_EMBEDDER="sentence-transformers")
    ctx = svc.context()
    text = b"The lighthouse keeper logs every passing ship in a leather book. " * 20
    r = ingest_bytes(ctx, text, dataset="default", filename="keeper.txt")
    if run_job(r.job_id, ctx=ctx).result != "succeeded":
        raise RuntimeError("the cold-search document was not indexed")
    if (
        query_encoder.export(Path(model_path(ctx.settings.embed_model)), ctx.settings.data_dir)
        is None
    ):
        raise RuntimeError("the query encoder could not be exported")
    seconds, cpu = [], []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        done = subprocess.run(
            _sluice("search", "who records the ships"),
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        seconds.append(time.perf_counter() - t0)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        if done.returncode != 0 or "keeper.txt" not in done.stdout:
            raise RuntimeError(f"the cold search found nothing:\n{done.stdout}{done.stderr}")
    # CPU seconds beside the wall clock: on a shared 2-core host only they compare across runs
    return {"seconds": seconds, "cpu_seconds": cpu, "load": os.getloadavg()}


if __name__ == "__main__":  # a quick look: python -m bench.coldstart
    from bench.system import clean_environment

    clean_environment()
    with Services() as services:
        print(worker_first_chunk(services, name="look"))
        print(console_first_page(services, name="look"))
        print(cold_search(services, name="look"))
    os._exit(0)
