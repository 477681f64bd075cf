"""An ordered stop of the real worker process (`sluice serve worker`, as the Procfile runs it):
SIGTERM or SIGINT stops it taking jobs, gives the running job its grace, hands back what it still
holds (pending, attempt not counted, never "waiting for Chroma"), and exits 0 with no traceback;
also when Chroma stops at the same moment, as under honcho."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from sluice.ops.ingest import ingest_bytes
from sluice.storage.models import JobStatus
from tests.support.helpers import events, job, until
from tests.support.servers import ChromaServer, Consumer

pytestmark = [pytest.mark.servers, pytest.mark.slow]

TEXT = b"The tide tables of the northern harbour are printed every autumn. " * 40


def _worker(env: dict, log) -> Consumer:
    """The worker as the Procfile starts it (ready once its presence key shows)."""
    worker = Consumer(env, log)
    worker.argv = [sys.executable, "-m", "sluice.cli", "serve", "worker", "--workers", "2"]
    return worker


def _held_job(ctx, worker, services, release, name: str) -> int:
    job_id = ingest_bytes(ctx, TEXT, dataset="default", filename=name).job_id
    worker.wait_ready(services.queue.client(), os.environ["SLUICE_QUEUE_NAME"])
    until(lambda: (release.parent / f"{release.name}.waiting").exists(), timeout=60, what="held")
    assert job(ctx, job_id).status == JobStatus.running
    return job_id


def _assert_handed_back(ctx, job_id: int, worker: Consumer) -> None:
    assert worker.proc.wait(20) == 0, worker.output()[-3000:]
    out = worker.output()
    assert "Traceback" not in out, out[-3000:]
    got = job(ctx, job_id)
    assert got.status == JobStatus.pending and got.attempt == 0, (got.status, got.attempt)
    assert not got.waiting_for and not got.error_message
    kinds = [e.kind for e in events(ctx, job_id)]
    assert kinds[-1] == "handed_back" and "waiting" not in kinds, kinds


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stopped_worker_hands_back_its_job_and_exits_0(
    ctx, sluice_env, services, tmp_path, signum
):
    release = tmp_path / "release"
    env = {**sluice_env, "SLUICE_FAULTS": f"after_parse=wait:{release}"}
    worker = _worker(env, tmp_path / "worker.log")
    worker.start()
    try:
        job_id = _held_job(ctx, worker, services, release, "tides.txt")
        started = time.monotonic()
        worker.proc.send_signal(signum)
        _assert_handed_back(ctx, job_id, worker)
        assert time.monotonic() - started < 5  # within honcho's 5 s before its SIGKILL
    finally:
        release.touch()
        worker.stop()


def test_chroma_stopping_beside_the_worker_is_not_the_jobs_outage(
    make_ctx, sluice_env, services, tmp_path
):
    """honcho sends SIGTERM to every process at once: the job meets a Chroma that is gone."""
    chroma = ChromaServer(tmp_path / "own")
    chroma.start()
    ctx = make_ctx(SLUICE_CHROMA_URL=chroma.url)
    release = tmp_path / "release"
    faults = f"after_parse=wait:{release}"
    env = {**sluice_env, "SLUICE_CHROMA_URL": chroma.url, "SLUICE_FAULTS": faults}
    worker = _worker(env, tmp_path / "worker.log")
    worker.start()
    try:
        job_id = _held_job(ctx, worker, services, release, "tides2.txt")
        worker.proc.send_signal(signal.SIGTERM)
        chroma.stop()
        release.touch()  # the job goes on, to a Chroma that no longer answers
        _assert_handed_back(ctx, job_id, worker)
    finally:
        release.touch()
        worker.stop()
        chroma.stop()
