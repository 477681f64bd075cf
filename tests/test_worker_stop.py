"""The pieces of a worker's ordered stop, each on its own: the model's lanes stop after the part
they hold (what still waits fails, so its job's attempt ends), and the query encoder's export, a
child process, ends at once; and the real worker (``sluice serve worker``, a huey consumer) with
the real model, stopped while its lanes encode, exits 0 with no abort and hands the job back.
``tests/test_stop.py`` stops the worker in the other ways."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from sluice import faults
from sluice.ops.ingest import ingest_bytes
from sluice.pipeline.running import embed, query_encoder
from sluice.storage.models import JobStatus
from tests.support.helpers import Background, events, job, until
from tests.support.servers import Consumer


def test_closed_lanes_finish_their_part_fail_what_waits_and_end():
    held, release = threading.Event(), threading.Event()

    def hold(texts, **_):
        if texts == ["first"]:
            held.set()
            assert release.wait(30)

    inner = embed.HashEmbedder()
    with faults.hook("lane_part", hold):
        lanes = embed.Lanes(inner.encode, 1, 1)
        first = lanes.submit(["first"], inner.dim)
        assert held.wait(30)  # the one lane is inside its part
        waiting = lanes.submit(["second", "third"], inner.dim)
        closing = Background(lambda: lanes.close(timeout=30), name="close")
        closing.start()
        with pytest.raises(embed.LanesClosed):
            waiting.result()  # failed at once, not encoded after the stop
        assert closing.is_alive()  # the part in flight is not cut off
        release.set()
        assert closing.result(30) == []  # every lane ended
    assert first.result().shape == (1, inner.dim)  # the part it held was finished
    assert not any(t.is_alive() for t in lanes.threads)
    with pytest.raises(embed.LanesClosed):
        lanes.submit(["late"], inner.dim).result()


def test_close_lanes_reaches_every_pool_of_the_process(monkeypatch):
    monkeypatch.setattr(embed, "_open", [])  # this test's pools only, not the process's model
    inner = embed.HashEmbedder()
    pools = [embed.Lanes(inner.encode, 2, 4) for _ in range(2)]
    assert pools[0].submit(["a"], inner.dim).result().shape == (1, inner.dim)
    assert embed.close_lanes(timeout=10) == []
    assert all(p.closed and not any(t.is_alive() for t in p.threads) for p in pools)


@pytest.mark.timeout(120)
def test_a_stop_ends_the_export_child_at_once(tmp_path, monkeypatch):
    """The export runs in a child process; ``stop`` ends it where it is (here held at its fault
    point, inside the export's lock) and leaves no export behind: the next start makes it."""
    model_dir = Path(embed.model_path("all-MiniLM-L6-v2"))
    go = tmp_path / "go"
    monkeypatch.setenv("SLUICE_FAULTS", f"query_export=wait:{go}")
    exporter = query_encoder.Exporter()
    runs = Background(lambda: exporter.run(model_dir, tmp_path), name="export")
    runs.start()
    try:
        until(Path(f"{go}.waiting").exists, timeout=60, what="the export child at its fault point")
        started = time.monotonic()
        exporter.stop()
        code = runs.result(10)
        took = time.monotonic() - started
    finally:
        go.touch()
    assert code is not None and code != 0 and took < 2, (code, took)
    assert not query_encoder.export_path(model_dir, tmp_path).exists()
    assert exporter.run(model_dir, tmp_path) is None  # stopped: it starts no other child


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_worker_stopped_while_its_lanes_encode_exits_cleanly_and_hands_back(
    make_ctx, services, tmp_path
):
    """Before, every stop of a worker mid-job aborted it: "terminate called without an active
    exception" (a lane thread inside torch at the interpreter's teardown), exit code -6."""
    never = tmp_path / "never"  # the export's child waits at its fault point: no CPU taken
    env = {
        "SLUICE_EMBEDDER": "sentence-transformers",
        "HF_HUB_OFFLINE": "1",
        "SLUICE_FAULTS": f"query_export=wait:{never}",
    }
    ctx = make_ctx(**env)
    sentences = (f"Line {i} of the tide tables of the northern harbour." for i in range(6000))
    data = " ".join(sentences).encode()
    job_id = ingest_bytes(ctx, data, dataset="default", filename="tides.txt").job_id
    worker = Consumer({**os.environ}, tmp_path / "worker.log")
    worker.argv = [sys.executable, "-m", "sluice.cli", "serve", "worker", "--workers", "2"]
    worker.start()
    try:
        until(
            lambda: (j := job(ctx, job_id)).stage == "embedding" and j.done > 0,
            timeout=240,
            what="the job embedding",
        )
        asked = time.monotonic()
        worker.proc.send_signal(signal.SIGTERM)
        code = worker.proc.wait(30)
        took = time.monotonic() - asked
    finally:
        worker.stop()
    out = worker.output()
    print(f"worker stopped {took:.2f} s after SIGTERM, exit code {code}")
    assert code == 0, out[-3000:]
    for bad in ("terminate called", "Traceback", "still running after the stop"):
        assert bad not in out, out[-3000:]
    got = job(ctx, job_id)
    assert got.status == JobStatus.pending and got.attempt == 0, (got.status, got.attempt)
    assert [e.kind for e in events(ctx, job_id)][-1] == "handed_back"
