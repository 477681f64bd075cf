"""Waiting versus stalled, attempt phases and the drain estimate: the console's small judgements."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from sluice.console.diagnose import why_waiting
from sluice.ops import drain
from sluice.ops.health import QueuePosition
from sluice.ops.reads import phases_of
from sluice.storage.models import utcnow

NOW = utcnow()


def _row(status: str, **kw) -> dict:
    row = {
        "status": status,
        "progress": "embedding 3/10 chunks",
        "worker_id": "host:1",
        "attempt": 1,
        "max_attempts": 5,
        "heartbeat_at": None,
        "next_attempt_at": None,
        "cancel_requested": False,
    }
    return {**row, **kw}


def _why(row, **kw):
    args = {
        "position": None,
        "workers": 1,
        "unsent": [],
        "ahead": 0,
        "lease_seconds": 60,
        "now": NOW,
        **kw,
    }
    return why_waiting(row, **args)


def test_running_job_is_stalled_once_its_heartbeat_is_older_than_the_lease():
    fresh = _row("running", heartbeat_at=(NOW - timedelta(seconds=5)).isoformat())
    assert _why(fresh) == (
        "info",
        "Running on host:1 (embedding 3/10 chunks); last heartbeat 5 s ago.",
    )
    stale = _row("running", heartbeat_at=(NOW - timedelta(seconds=300)).isoformat())
    level, text = _why(stale)
    assert level == "warning" and text.startswith(
        "Stalled: worker host:1 has not reported for 300 s"
    )


def test_pending_job_in_queue_waits_or_stalls_by_the_workers():
    row = _row("pending")
    at3 = QueuePosition(True, position=3, length=9, scanned=9)
    assert _why(row, position=at3, workers=2) == (
        "info",
        "Waiting in the queue: position 3 of 9; 2 worker(s) alive.",
    )
    level, text = _why(row, position=at3, workers=0)
    assert level == "warning" and "no worker is alive" in text


def test_pending_job_deep_in_a_long_queue():
    deep = QueuePosition(True, position=None, length=250_000, scanned=10_000)
    assert _why(_row("pending"), position=deep, workers=3) == (
        "info",
        "Waiting in the queue behind more than 10,000 other jobs (250,000 queued); 3 worker(s) "
        "alive.",
    )


def test_pending_job_not_on_the_queue_says_why():
    row = _row("pending")
    level, text = _why(row, position=QueuePosition(True, position=None, length=4, scanned=4))
    assert level == "warning" and "not in the queue" in text
    level, text = _why(
        row,
        position=QueuePosition(True, length=0),
        unsent=[{"last_error": "ConnectionError: refused"}],
    )
    assert level == "warning" and "publishing it failed (ConnectionError: refused)" in text
    level, text = _why(row, position=QueuePosition(False, error="ConnectionError: down"), ahead=12)
    assert level == "warning" and "12 job(s) wait ahead" in text and "unreachable" in text


def test_a_message_just_taken_by_a_worker_is_no_alarm():
    # right after a retry the worker pops the message before it claims the job: not a lost message
    row, gone = _row("pending"), QueuePosition(True, position=None, length=0, scanned=0)
    level, text = _why(
        row, position=gone, published_at=NOW - timedelta(seconds=1), redeliver_after=60
    )
    assert level == "info" and "Handed to a worker 1 s ago" in text
    level, text = _why(
        row, position=gone, published_at=NOW - timedelta(seconds=90), redeliver_after=60
    )
    assert level == "warning" and "published 90 s ago" in text and "may have been lost" in text


def test_retrying_job_says_when_its_next_attempt_is_due():
    row = _row("retrying", next_attempt_at=(NOW + timedelta(seconds=42)).isoformat())
    assert _why(row, workers=1) == (
        "info",
        "Retrying: attempt 2 of 5 is due in 42 s; 1 worker(s) alive.",
    )
    assert _why(_row("succeeded")) is None


def test_a_job_waiting_for_a_dependency_says_what_it_waits_for():
    row = _row(
        "retrying",
        attempt=0,
        next_attempt_at=(NOW + timedelta(seconds=9)).isoformat(),
        waiting_for="Chroma at http://127.0.0.1:8100",
        waiting_since=(NOW - timedelta(seconds=180)).isoformat(),
    )
    assert _why(row, workers=2) == (
        "info",
        "Waiting for Chroma at http://127.0.0.1:8100 for 180 s: not the "
        "job's failure, no attempt is spent. It looks again in 9 s and resumes "
        "by itself; 2 worker(s) alive.",
    )


def test_phases_split_the_event_log_into_waits_and_attempts():
    t = [NOW + timedelta(seconds=s) for s in (0, 2, 5, 6, 9, 20)]
    events = [
        {"kind": "created", "at": t[0], "attempt": 0, "actor": "console:local", "stage": "queued"},
        {"kind": "claimed", "at": t[1], "attempt": 1, "actor": "w:1", "stage": "parsing"},
        {"kind": "attempt_failed", "at": t[2], "attempt": 1, "actor": "w:1", "stage": "embedding"},
        {"kind": "claimed", "at": t[3], "attempt": 2, "actor": "w:2", "stage": "parsing"},
        {"kind": "succeeded", "at": t[4], "attempt": 2, "actor": "w:2", "stage": "done"},
    ]
    phases = phases_of(events)
    assert [(p.what, p.seconds, p.worker, p.outcome, p.reached) for p in phases] == [
        ("waiting in queue", 2.0, "", "claimed", ""),
        ("attempt 1", 3.0, "w:1", "attempt failed", "embedding"),
        ("backoff wait", 1.0, "", "claimed", ""),
        ("attempt 2", 3.0, "w:2", "succeeded", "done"),
    ]
    running = phases_of(events[:2])
    assert running[-1].what == "attempt 1" and running[-1].ended is None


def test_drain_estimate_counts_work_left_at_the_busy_rate_not_the_idle_average():
    # The walkthrough's case: four 150-page jobs (600 chunks each) finished in about 28 s, in a
    # window that was otherwise idle; four more of the same size are queued. Jobs per minute over
    # the window said "6.0 min"; the work at the busy rate says about half a minute.
    t0 = datetime(2026, 1, 1, 12, 0, 0)
    finished = [
        (t0 + timedelta(seconds=7 * i), t0 + timedelta(seconds=7 * (i + 1)), 600, 3_000_000)
        for i in range(4)
    ]
    active = [("queued", 0, 0, 3_000_000)] * 3 + [("embedding", 300, 600, 3_000_000)]
    est = drain.estimate(finished=finished, active=drain.WorkLeft.of(active))
    assert est.busy_seconds == 28 and est.chunks_per_second == pytest.approx(2400 / 28)
    assert est.remaining_chunks == pytest.approx(3 * 600 + 300)
    assert est.eta == timedelta(seconds=2100 / (2400 / 28))
    assert est.confidence == "rough" and "rough estimate" in est.describe()


def test_busy_time_is_the_union_of_attempts_that_overlap():
    t0 = datetime(2026, 1, 1, 12, 0, 0)
    at = [
        (t0, t0 + timedelta(seconds=10)),
        (t0 + timedelta(seconds=5), t0 + timedelta(seconds=12)),
        (t0 + timedelta(seconds=100), t0 + timedelta(seconds=101)),
    ]
    assert drain.busy_seconds(at) == 13


def test_drain_estimate_admits_when_there_is_no_rate():
    queued = drain.WorkLeft.of([("queued", 0, 0, 100)])
    assert drain.estimate(finished=[], active=queued).eta is None
    assert "no rate" in drain.estimate(finished=[], active=queued).describe()
    assert drain.estimate(finished=[], active=drain.WorkLeft()).eta == timedelta(0)
