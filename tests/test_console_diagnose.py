"""Waiting versus stalled, attempt phases and the drain estimate: the console's small judgements."""

from __future__ import annotations

from datetime import timedelta

from sluice.console.diagnose import why_waiting
from sluice.ops.health import QueuePosition
from sluice.ops.reads import Overview, phases_of
from sluice.storage.models import utcnow

NOW = utcnow()


def _row(status: str, **kw) -> dict:
    row = {"status": status, "progress": "embedding 3/10 chunks", "worker_id": "host:1", "attempt": 1,
           "max_attempts": 5, "heartbeat_at": None, "next_attempt_at": None, "cancel_requested": False}
    return {**row, **kw}


def _why(row, **kw):
    args = {"position": None, "workers": 1, "unsent": [], "ahead": 0, "lease_seconds": 60, "now": NOW, **kw}
    return why_waiting(row, **args)


def test_running_job_is_stalled_once_its_heartbeat_is_older_than_the_lease():
    fresh = _row("running", heartbeat_at=(NOW - timedelta(seconds=5)).isoformat())
    assert _why(fresh) == ("info", "Running on host:1 (embedding 3/10 chunks); last heartbeat 5 s ago.")
    stale = _row("running", heartbeat_at=(NOW - timedelta(seconds=300)).isoformat())
    level, text = _why(stale)
    assert level == "warning" and text.startswith("Stalled: worker host:1 has not reported for 300 s")


def test_pending_job_in_queue_waits_or_stalls_by_the_workers():
    row = _row("pending")
    at3 = QueuePosition(True, position=3, length=9, scanned=9)
    assert _why(row, position=at3, workers=2) == ("info", "Waiting in the queue: position 3 of 9; 2 worker(s) alive.")
    level, text = _why(row, position=at3, workers=0)
    assert level == "warning" and "no worker is alive" in text


def test_pending_job_deep_in_a_long_queue():
    deep = QueuePosition(True, position=None, length=250_000, scanned=10_000)
    assert _why(_row("pending"), position=deep, workers=3) == (
        "info", "Waiting in the queue behind more than 10,000 other jobs (250,000 queued); 3 worker(s) alive.")


def test_pending_job_not_on_the_queue_says_why():
    row = _row("pending")
    level, text = _why(row, position=QueuePosition(True, position=None, length=4, scanned=4))
    assert level == "warning" and "not in the queue" in text
    level, text = _why(row, position=QueuePosition(True, length=0),
                       unsent=[{"last_error": "ConnectionError: refused"}])
    assert level == "warning" and "publishing it failed (ConnectionError: refused)" in text
    level, text = _why(row, position=QueuePosition(False, error="ConnectionError: down"), ahead=12)
    assert level == "warning" and "12 job(s) wait ahead" in text and "unreachable" in text


def test_retrying_job_says_when_its_next_attempt_is_due():
    row = _row("retrying", next_attempt_at=(NOW + timedelta(seconds=42)).isoformat())
    assert _why(row, workers=1) == ("info", "Retrying: attempt 2 of 5 is due in 42 s; 1 worker(s) alive.")
    assert _why(_row("succeeded")) is None


def test_a_job_waiting_for_a_dependency_says_what_it_waits_for():
    row = _row("retrying", attempt=0, next_attempt_at=(NOW + timedelta(seconds=9)).isoformat(),
               waiting_for="Chroma at http://127.0.0.1:8100",
               waiting_since=(NOW - timedelta(seconds=180)).isoformat())
    assert _why(row, workers=2) == ("info", "Waiting for Chroma at http://127.0.0.1:8100 for 180 s: not the "
                                    "job's failure, no attempt is spent. It looks again in 9 s and resumes "
                                    "by itself; 2 worker(s) alive.")


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


def test_drain_estimate_uses_the_measured_rate_or_admits_there_is_none():
    base = {"oldest_pending": None, "failures": {}, "throughput": []}
    busy = Overview(counts={"pending": 20, "running": 10}, finished_recently=45, **base)
    assert busy.rate_per_minute == 3.0 and busy.drain_eta() == timedelta(minutes=10)
    assert Overview(counts={"pending": 5}, finished_recently=0, **base).drain_eta() is None
    assert Overview(counts={"succeeded": 5}, finished_recently=0, **base).drain_eta() == timedelta(0)
