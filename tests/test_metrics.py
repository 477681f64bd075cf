"""`sluice serve metrics`: a real process serving Prometheus's /metrics, scraped and parsed with the
client library's own text parser."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sluice.ops.ingest import ingest_bytes
from sluice.pipeline.running.runner import run_job
from tests.support.servers import ManagedProcess, free_port, wait_port


def scrape(url: str) -> dict[str, dict]:
    with urllib.request.urlopen(url, timeout=10) as r:
        text = r.read().decode()
    out: dict[str, dict] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def test_metrics_report_jobs_failures_durations_and_the_cache(ctx, tmp_path):
    good = ingest_bytes(
        ctx,
        b"Tide tables list high and low water for every harbour. " * 60,
        dataset="default",
        filename="tides.txt",
    )
    bad = ingest_bytes(ctx, b"%PDF-1.4\n" + b"\x00" * 300, dataset="default", filename="broken.pdf")
    assert run_job(good.job_id, ctx=ctx).result == "succeeded"
    run_job(bad.job_id, ctx=ctx)

    port = free_port()
    env = {**os.environ, "SLUICE_METRICS_PORT": str(port)}
    proc = ManagedProcess(
        [sys.executable, "-m", "sluice.cli", "serve", "metrics"],
        log=tmp_path / "metrics.log",
        env=env,
    )
    proc.start()
    try:
        wait_port(port, 30)
        m = scrape(f"http://127.0.0.1:{port}/metrics")
    finally:
        proc.stop()

    jobs = m["sluice_jobs"]
    assert jobs[(("dataset", "default"), ("status", "succeeded"))] == 1
    assert jobs[(("dataset", "default"), ("status", "failed"))] == 1
    [(labels, n)] = m["sluice_job_failures_total"].items()
    assert n == 1 and dict(labels)["kind"] == "permanent"
    assert m["sluice_job_duration_seconds_count"][()] == 1
    stages = {dict(k)["stage"] for k in m["sluice_stage_duration_seconds_count"]}
    assert {"parsing", "embedding", "indexing"} <= stages
    assert m["sluice_chunks_embedded_total"][()] > 0
    assert 0 <= m["sluice_embedding_cache_hit_ratio"][()] <= 1
    assert (
        m["sluice_up"][(("service", "database"),)] == 1
        and m["sluice_up"][(("service", "queue"),)] == 1
    )
    assert m["sluice_workers_alive"][()] == 0
    assert m["sluice_oldest_pending_job_age_seconds"][()] == 0


def test_the_event_tail_forgets_attempts_that_end_without_success_or_failure(ctx):
    """An attempt cancelled, superseded, deleted or waiting out an outage ends too: the tail that
    times attempts must not keep its claim forever (it would grow with every such attempt)."""
    from sqlmodel import Session

    from sluice.errors import ErrorKind
    from sluice.ops.metrics import EventTail
    from sluice.storage import jobs

    tail = EventTail()
    ids = [
        ingest_bytes(
            ctx,
            f"document {i} about tides. ".encode() * 40,
            dataset="default",
            filename=f"d{i}.txt",
        ).job_id
        for i in range(2)
    ]
    with Session(ctx.engine) as session:
        leases = {
            i: jobs.claim(session=session, job_id=i, worker_id="w", lease_seconds=60).job.lease
            for i in ids
        }
    tail.advance()
    assert set(tail.claimed_at) == set(ids)
    with Session(ctx.engine) as session:
        assert jobs.request_cancel(session=session, job_ids=[ids[0]], actor="op")[0].ok
        assert jobs.acknowledge_cancel(
            session=session, job_id=ids[0], lease=leases[ids[0]], worker_id="w"
        )
        jobs.fail(
            session=session,
            job_id=ids[1],
            lease=leases[ids[1]],
            error=jobs.JobError(ErrorKind.transient, "service_unavailable", "Chroma down"),
            worker_id="w",
            retry=jobs.RetryPolicy(base_delay=1, max_delay=2),
            wait=jobs.WaitPolicy("Chroma at test", poll_seconds=1, max_wait_seconds=60),
        )
    tail.advance()
    assert tail.claimed_at == {} and tail.failures == {}


# --- who may read /metrics ------------------------------------------------------------------------

TOKEN = "metrics-Token-0c1d2e3f"


def _metrics(tmp_path, **env) -> tuple[ManagedProcess, int]:
    port = free_port()
    proc = ManagedProcess(
        [sys.executable, "-m", "sluice.cli", "serve", "metrics"],
        log=tmp_path / f"metrics-{port}.log",
        env={**os.environ, "SLUICE_METRICS_PORT": str(port), **env},
    )
    proc.start()
    return proc, port


def _get(port: int, **headers) -> httpx.Response:
    return httpx.get(f"http://127.0.0.1:{port}/metrics", headers=headers, timeout=10)


def test_metrics_answer_only_their_own_host_and_ask_for_the_token(sluice_env, tmp_path):
    """A page that rebinds its name to 127.0.0.1 sends its own Host and is refused; with
    SLUICE_METRICS_TOKEN set, a scrape without it (or with another) gets 401."""
    proc, port = _metrics(tmp_path)
    try:
        wait_port(port, 30)
        forged = _get(port, Host=f"rebind.attacker.example:{port}")
        assert forged.status_code == 403, f"a foreign Host got {forged.status_code}"
        assert "sluice_jobs" not in forged.text
        assert _get(port).status_code == 200  # loopback, no token set: open as before
    finally:
        proc.stop()

    proc, port = _metrics(tmp_path, SLUICE_METRICS_TOKEN=TOKEN, SLUICE_METRICS_HOSTS="scrape.lan")
    try:
        wait_port(port, 30)
        for headers in ({}, {"Authorization": "Bearer not-the-token"}, {"Authorization": TOKEN}):
            refused = _get(port, **headers)
            assert refused.status_code == 401, f"{headers} got {refused.status_code}"
            assert "sluice_" not in refused.text and TOKEN not in refused.text
            assert refused.headers["WWW-Authenticate"].startswith("Bearer")
        bearer = {"Authorization": f"Bearer {TOKEN}"}
        assert _get(port, Host=f"rebind.attacker.example:{port}", **bearer).status_code == 403
        for host in (f"127.0.0.1:{port}", f"scrape.lan:{port}"):
            ok = _get(port, Host=host, **bearer)
            assert ok.status_code == 200 and "sluice_jobs" in ok.text, (host, ok.status_code)
    finally:
        proc.stop()
    assert TOKEN not in proc.output()


@pytest.mark.parametrize("address", ["0.0.0.0", "outside"])
def test_metrics_refuse_to_listen_beyond_loopback_without_a_token(sluice_env, tmp_path, address):
    if address == "outside":
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))  # picks the outgoing interface; sends nothing
            address = s.getsockname()[0]
        if address.startswith("127."):
            pytest.skip("this machine has no non-loopback address")
    proc, port = _metrics(tmp_path, SLUICE_METRICS_ADDRESS=address)
    try:
        code = proc.proc.wait(30)
    except subprocess.TimeoutExpired:
        scraped = _get(port).status_code if address == "0.0.0.0" else "?"
        pytest.fail(f"/metrics listens on {address} with no token (a scrape got {scraped})")
    finally:
        proc.stop()
    assert code == 2, proc.output()
    assert "SLUICE_METRICS_TOKEN" in proc.output() and "SLUICE_METRICS_ADDRESS" in proc.output()

    proc, port = _metrics(tmp_path, SLUICE_METRICS_ADDRESS=address, SLUICE_METRICS_TOKEN=TOKEN)
    host = "127.0.0.1" if address == "0.0.0.0" else address
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with socket.create_connection((host, port), timeout=0.5):
                    break
            except OSError:
                assert proc.alive() and time.monotonic() < deadline, proc.output()
                time.sleep(0.05)
        scrape = httpx.get(
            f"http://{host}:{port}/metrics",
            headers={"Authorization": f"Bearer {TOKEN}"},
            timeout=10,
        )
        assert scrape.status_code == 200 and "sluice_jobs" in scrape.text
    finally:
        proc.stop()
