"""Prometheus metrics, read from the job database and the queue at scrape time (``sluice serve
metrics``).

The job database is the source of truth, so the exporter keeps no state of its own: every scrape
reads counts (cheap, indexed, grouped in SQL) and turns them into metric families. Counters are
totals over the jobs the database keeps (``sluice prune`` removing old rows can lower them, which
Prometheus treats as a counter reset). Durations and failures come from the audit log (JobEvent),
which the exporter follows from where it left off, so a scrape reads only what is new.

    sluice_jobs{dataset,status}               gauge      jobs by state (0 for a status none is in)
    sluice_queue_messages{state}              gauge      queued / scheduled, in the queue Redis
    sluice_oldest_pending_job_age_seconds     gauge      how long the oldest pending job has waited
    sluice_job_duration_seconds               histogram  last attempt of each succeeded job
    sluice_stage_duration_seconds{stage}      histogram  time per stage of succeeded jobs
    sluice_chunks_embedded_total              counter    chunks the model encoded
    sluice_chunks_from_cache_total            counter    chunks the embedding cache served
    sluice_embedding_cache_hit_ratio          gauge      from cache / (embedded + from cache)
    sluice_job_failures_total{kind,code}      counter    failed attempts by error kind and code
    sluice_workers_alive,
    sluice_worker_threads                     gauge      consumer processes and their threads
    sluice_up{service}                        gauge      1 when the service answered this scrape
                                                         (database, queue, cache, chroma and
                                                         object_store when uploads live in S3)
    sluice_index_unreachable_chunks{dataset}  gauge      sampled chunks their own vector missed
    sluice_index_sampled_chunks{dataset},
    sluice_index_recall{dataset}                         the last reconcile's index audit
    sluice_source_documents{source,dataset},
    sluice_source_last_sync_files{source,change},
    sluice_source_last_sync_seconds{source}    gauge      each source and what its last sync did

The server answers only at its own names (the console's Host and Origin rule, with
SLUICE_METRICS_ADDRESS and SLUICE_METRICS_HOSTS: a page that rebinds its DNS name to this machine is
refused), asks for ``Authorization: Bearer $SLUICE_METRICS_TOKEN`` when the token is set, and
refuses to listen beyond loopback without one: dataset names and failure codes are not public.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from sluice.ops.health import probes
from sluice.ops.reads import MetricCounts, ctx, events_after, last_reconcile, metric_counts
from sluice.ops.sources import syncing
from sluice.pipeline.queueing import broker

log = logging.getLogger(__name__)

DURATION_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)


class Buckets:
    """A cumulative histogram kept as counts (constant memory however long the log)."""

    def __init__(self, bounds: Iterable[float] = DURATION_BUCKETS) -> None:
        self.bounds = list(bounds)
        self.counts = [0] * len(self.bounds)
        self.count = 0
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.count += 1
        self.sum += value
        for i, bound in enumerate(self.bounds):
            if value <= bound:
                self.counts[i] += 1

    def samples(self) -> list[tuple[str, int]]:
        return [(str(b), n) for b, n in zip(self.bounds, self.counts, strict=True)] + [
            ("+Inf", self.count)
        ]


class EventTail:
    """Follows the audit log: attempt durations, stage durations and failures, as cumulative
    histograms and counters since the oldest event the database keeps."""

    KINDS = ("claimed", "succeeded", "attempt_failed", "failed")
    # Other ends of an attempt: they count in neither figure, but the attempt is over.
    ENDS = ("cancelled", "superseded", "deleted", "waiting")
    BATCH = 10_000
    MAX_BATCHES = (
        20  # per scrape: a long log is caught up over a few scrapes, never in one slow one
    )

    def __init__(self) -> None:
        self.last_id = 0
        self.claimed_at: dict[int, object] = {}
        self.job_seconds = Buckets()
        self.stage_seconds: dict[str, Buckets] = {}
        self.failures: dict[tuple[str, str], int] = {}

    def advance(self) -> None:
        for _ in range(self.MAX_BATCHES):
            events = events_after(self.last_id, self.KINDS + self.ENDS, limit=self.BATCH)
            for e in events:
                self._take(e)
            if len(events) < self.BATCH:
                return

    def _take(self, e: dict) -> None:
        self.last_id = e["id"]
        data = e["data"]
        if e["kind"] == "claimed":
            self.claimed_at[e["job_id"]] = e["at"]
            return
        started = self.claimed_at.pop(e["job_id"], None)
        if e["kind"] in self.ENDS:
            return
        if e["kind"] == "succeeded":
            if started is not None:
                self.job_seconds.observe(max(0.0, (e["at"] - started).total_seconds()))
            for stage, seconds in (data.get("stages") or {}).items():
                self.stage_seconds.setdefault(stage, Buckets()).observe(float(seconds))
        else:
            key = (str(data.get("kind") or "unknown"), str(data.get("code") or "unknown"))
            self.failures[key] = self.failures.get(key, 0) + 1


def histogram(
    name: str, doc: str, by_label: dict[tuple, Buckets], labels: list[str]
) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, doc, labels=labels)
    for label_values, buckets in by_label.items():
        family.add_metric(list(label_values), buckets.samples(), sum_value=buckets.sum)
    return family


class SluiceCollector(Collector):
    def __init__(self) -> None:
        self.tail = EventTail()

    def collect(self) -> Iterable[Metric]:
        up = GaugeMetricFamily(
            "sluice_up", "1 when the service answered this scrape", labels=["service"]
        )
        try:
            c = metric_counts()
            self.tail.advance()
        except Exception as exc:  # the database is down: say so, do not fail the scrape
            log.warning("metrics: job database unreachable: %s", exc)
            up.add_metric(["database"], 0)
            yield up
            return
        up.add_metric(["database"], 1)
        yield from self._job_families(c)
        yield from _index_families()
        yield from syncing.metric_families(ctx())
        yield from _queue_families(up)
        settings = ctx().settings
        for probe in probes(settings):  # the probe's short timeout: within a scrape's deadline
            if probe.name in ("cache Redis", "chroma"):
                up.add_metric([probe.name.split()[0]], 1 if probe.reachable else 0)
            elif probe.name == "object store":  # one that does not answer holds every job
                up.add_metric(["object_store"], 1 if probe.reachable else 0)
        yield up

    def _job_families(self, c: MetricCounts) -> Iterable[Metric]:
        """Jobs by status, waiting, durations, chunks embedded and cached, failures."""
        jobs = GaugeMetricFamily(
            "sluice_jobs", "Jobs by dataset and status", labels=["dataset", "status"]
        )
        for (dataset, status), n in sorted(c.jobs.items()):
            jobs.add_metric([dataset, status], n)
        yield jobs

        yield GaugeMetricFamily(
            "sluice_oldest_pending_job_age_seconds",
            "Seconds the oldest pending job has waited (0 when none waits)",
            value=c.oldest_pending_seconds,
        )
        t = self.tail
        yield histogram(
            "sluice_job_duration_seconds",
            "Duration of the attempt that succeeded, claim to success",
            {(): t.job_seconds},
            [],
        )
        yield histogram(
            "sluice_stage_duration_seconds",
            "Time spent in each stage by attempts that succeeded",
            {(stage,): v for stage, v in sorted(t.stage_seconds.items())},
            ["stage"],
        )
        yield CounterMetricFamily(
            "sluice_chunks_embedded", "Chunks the model encoded", value=c.embedded
        )
        yield CounterMetricFamily(
            "sluice_chunks_from_cache", "Chunks served by the embedding cache", value=c.cached
        )
        total = c.embedded + c.cached
        yield GaugeMetricFamily(
            "sluice_embedding_cache_hit_ratio",
            "Share of chunks the embedding cache served (0 before any)",
            value=c.cached / total if total else 0.0,
        )
        failures = CounterMetricFamily(
            "sluice_job_failures", "Failed attempts by error kind and code", labels=["kind", "code"]
        )
        for (kind, code), n in sorted(t.failures.items()):
            failures.add_metric([kind, code], n)
        yield failures


def _index_families() -> Iterable[Metric]:
    """What each dataset's vector index returned at the last reconcile (its saved report)."""
    unreachable = GaugeMetricFamily(
        "sluice_index_unreachable_chunks",
        "Sampled chunks their own vector did not find, at the last reconcile",
        labels=["dataset"],
    )
    sampled = GaugeMetricFamily(
        "sluice_index_sampled_chunks",
        "Chunks the last reconcile queried with their own vector",
        labels=["dataset"],
    )
    recall = GaugeMetricFamily(
        "sluice_index_recall",
        "Recall@k of sample queries against exact search over the stored vectors, last reconcile",
        labels=["dataset"],
    )
    for d in (last_reconcile() or {}).get("datasets", []):
        index = d.get("index") or {}
        if not index:
            continue
        unreachable.add_metric([d["name"]], index.get("unreachable", 0))
        sampled.add_metric([d["name"]], index.get("sampled", 0))
        if index.get("recall") is not None:
            recall.add_metric([d["name"]], index["recall"])
    yield unreachable
    yield sampled
    yield recall


def _queue_families(up: GaugeMetricFamily) -> Iterable[Metric]:
    """Messages, live workers and their threads, from the queue Redis (``up`` says if it
    answered)."""
    messages = GaugeMetricFamily(
        "sluice_queue_messages", "Messages in the queue Redis", labels=["state"]
    )
    workers = GaugeMetricFamily(
        "sluice_workers_alive", "Consumer processes seen in the last seconds"
    )
    threads = GaugeMetricFamily("sluice_worker_threads", "Worker threads of the live consumers")
    try:
        depth, alive = broker.queue_depth(), broker.workers_alive()
    except Exception as exc:
        log.warning("metrics: queue Redis unreachable: %s", exc)
        up.add_metric(["queue"], 0)
    else:
        up.add_metric(["queue"], 1)
        for state in ("queued", "scheduled"):
            messages.add_metric([state], depth.get(state, 0))
        workers.add_metric([], len(alive))
        threads.add_metric([], sum(int(w.get("threads") or 0) for w in alive))
        yield messages
        yield workers
        yield threads


def registry():
    from prometheus_client import CollectorRegistry

    reg = CollectorRegistry(auto_describe=False)
    reg.register(SluiceCollector())
    return reg
