"""The Prometheus collector in process (``sluice serve metrics`` serves it: tests/test_metrics.py):
whether each service answers (sluice_up), and a series for every job status from the first
scrape."""

from __future__ import annotations

from tests.support.helpers import run_file


def test_metrics_say_whether_chroma_and_the_cache_answer_and_every_job_status_from_zero(ctx):
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from sluice.ops.metrics import SluiceCollector

    run_file(ctx, b"Charts of the northern sound. " * 40, "charts.txt", "default")
    registry = CollectorRegistry()
    registry.register(SluiceCollector())
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(generate_latest(registry).decode())
        for s in family.samples
    }
    up = {dict(k)["service"]: v for (name, k), v in samples.items() if name == "sluice_up"}
    assert up == {"database": 1, "queue": 1, "cache": 1, "chroma": 1}
    jobs = {
        dict(k)["status"]: v
        for (name, k), v in samples.items()
        if name == "sluice_jobs" and dict(k)["dataset"] == "default"
    }
    assert jobs["succeeded"] == 1
    assert {s: jobs.get(s) for s in ("failed", "cancelled", "pending", "deleted")} == {
        "failed": 0,
        "cancelled": 0,
        "pending": 0,
        "deleted": 0,
    }
