"""`sluice serve metrics`: a real process serving Prometheus's /metrics, scraped and parsed with the
client library's own text parser."""

from __future__ import annotations

import os
import sys
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from sluice.ops.ingest import ingest_bytes
from sluice.pipeline.runner import run_job
from tests.servers import ManagedProcess, free_port, wait_port


def scrape(url: str) -> dict[str, dict]:
    with urllib.request.urlopen(url, timeout=10) as r:
        text = r.read().decode()
    out: dict[str, dict] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def test_metrics_report_jobs_failures_durations_and_the_cache(ctx, tmp_path):
    good = ingest_bytes(ctx, b"Tide tables list high and low water for every harbour. " * 60,
                        dataset="default", filename="tides.txt")
    bad = ingest_bytes(ctx, b"%PDF-1.4\n" + b"\x00" * 300, dataset="default", filename="broken.pdf")
    assert run_job(good.job_id, ctx=ctx).result == "succeeded"
    run_job(bad.job_id, ctx=ctx)

    port = free_port()
    env = {**os.environ, "SLUICE_METRICS_PORT": str(port)}
    proc = ManagedProcess([sys.executable, "-m", "sluice.cli", "serve", "metrics"], log=tmp_path / "metrics.log",
                          env=env)
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
    assert m["sluice_up"][(("service", "database"),)] == 1 and m["sluice_up"][(("service", "queue"),)] == 1
    assert m["sluice_workers_alive"][()] == 0
    assert m["sluice_oldest_pending_job_age_seconds"][()] == 0
