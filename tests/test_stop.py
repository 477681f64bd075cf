"""An ordered stop of the real worker process (`sluice serve worker`, as the Procfile runs it):
SIGTERM or SIGINT stops it taking jobs, gives the running job its grace, hands back what it still
holds (pending, attempt not counted, never "waiting for Chroma"), and exits 0 with no traceback;
also when Chroma stops at the same moment, as under honcho."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path

import httpx
import pytest
import redis

from sluice.ops.ingest import ingest_bytes
from sluice.storage.models import JobStatus
from tests.support.api_server import make_key
from tests.support.helpers import events, job, until
from tests.support.servers import ROOT, ChromaServer, Consumer, free_port, wait_port

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


def _make_run_recipe() -> str:
    """The command of the Makefile's run target, as make would run it."""
    lines = (ROOT / "Makefile").read_text().splitlines()
    recipe = lines[lines.index(next(x for x in lines if x.startswith("run:"))) + 1]
    return recipe.strip().replace("$(BIN)/", f"{Path(sys.executable).parent}/")


def _on_a_terminal(argv: list[str], env: dict, cwd: Path) -> tuple[subprocess.Popen, int, list]:
    """Start argv as the session leader of a new pseudo-terminal (its controlling terminal), as a
    shell starts `make run`; a thread keeps reading what it prints."""
    master, slave = os.openpty()

    def controlling_terminal() -> None:
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    proc = subprocess.Popen(
        argv,
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=env,
        cwd=cwd,
        preexec_fn=controlling_terminal,  # noqa: PLW1509 - a terminal test needs one
    )
    os.close(slave)
    seen: list[bytes] = []

    def read() -> None:
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:
                return
            if not data:
                return
            seen.append(data)

    threading.Thread(target=read, daemon=True).start()
    return proc, master, seen


def test_make_run_then_ctrl_c_stops_everything_in_order_and_exits_0(make_ctx, tmp_path):
    """`make run` under a terminal, every process of the Procfile on free ports, a job running:
    Ctrl-C hands the job back, stops the servers last, prints no traceback, and make exits 0."""
    password = "pw" + os.urandom(6).hex()
    ports = [free_port() for _ in range(6)]
    system = {
        "SLUICE_DATA_DIR": str(tmp_path / "data"),
        "SLUICE_QUEUE_REDIS_URL": f"redis://:{password}@127.0.0.1:{ports[0]}/0",
        "SLUICE_CACHE_REDIS_URL": f"redis://:{password}@127.0.0.1:{ports[1]}/0",
        "SLUICE_CHROMA_URL": f"http://127.0.0.1:{ports[2]}",
        "SLUICE_CONSOLE_PORT": str(ports[3]),
        "SLUICE_METRICS_PORT": str(ports[4]),
        "SLUICE_API_PORT": str(ports[5]),
    }
    ctx = make_ctx(**system)
    release = tmp_path / "release"
    (tmp_path / "Procfile").write_text((ROOT / "Procfile").read_text())
    (tmp_path / "Makefile").write_text(f"run:\n\t{_make_run_recipe()}\n")
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "SLUICE_FAULTS": f"after_parse=wait:{release}",
    }
    proc, master, seen = _on_a_terminal(["make", "run"], env, tmp_path)
    try:
        queue = redis.Redis.from_url(system["SLUICE_QUEUE_REDIS_URL"])
        until(lambda: _answers(queue), timeout=60, what="the queue Redis")
        until(
            lambda: any(queue.scan_iter(match=f"sluice.workers.{ctx.settings.queue_name}:*")),
            timeout=90,
            what="the worker",
        )
        for port in ports[3:]:
            wait_port(port, 90)
        job_id = ingest_bytes(ctx, TEXT, dataset="default", filename="tides3.txt").job_id
        until(lambda: Path(f"{release}.waiting").exists(), timeout=60, what="the job held")
        stream = _Stream(f"http://127.0.0.1:{ports[5]}", make_key("w", datasets=None, scope="read"))
        until(lambda: stream.lines, timeout=60, what="the event stream open")
        os.write(master, b"\x03")  # Ctrl-C: SIGINT to the terminal's foreground group
        asked = time.monotonic()
        assert proc.wait(60) == 0, b"".join(seen).decode(errors="replace")[-4000:]
        took = time.monotonic() - asked
    finally:
        release.touch()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    out = b"".join(seen).decode(errors="replace")
    assert "Traceback" not in out and "SIGKILL" not in out and "Error 130" not in out, out[-4000:]
    assert "terminate called" not in out, out[-4000:]
    stream.thread.join(10)
    assert stream.error is None and not stream.thread.is_alive(), stream.error
    assert stream.lines[-1] == ": closed: the API is stopping", stream.lines
    # With a stream open and a job running, the stop is bounded by the worker's hand-back, not by
    # the stream (it took 95 s before); STOP_BOUND is far from both, so a loaded machine passes.
    assert took < STOP_BOUND, f"make run took {took:.1f} s to stop after Ctrl-C"
    print(f"make run stopped {took:.1f} s after Ctrl-C, a stream open and a job running")
    assert out.index("sending SIGTERM to worker") < out.index("sending SIGTERM to chroma")
    got = job(ctx, job_id)
    assert got.status == JobStatus.pending and got.attempt == 0 and not got.waiting_for
    assert [e.kind for e in events(ctx, job_id)][-1] == "handed_back"


STOP_BOUND = 30.0


class _Stream:
    """``GET /v1/events`` read in a thread until the API ends it; its lines and its error."""

    def __init__(self, url: str, token: str) -> None:
        self.lines: list[str] = []
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._read, args=(url, token), daemon=True)
        self.thread.start()

    def _read(self, url: str, token: str) -> None:
        try:
            with httpx.stream(
                "GET",
                f"{url}/v1/events",
                headers={"Authorization": f"Bearer {token}"},
                params={"seconds": "120"},
                timeout=httpx.Timeout(30, read=90),
            ) as r:
                r.raise_for_status()
                self.lines.extend(line for line in r.iter_lines() if line)
        except BaseException as exc:  # surfaced by the test
            self.error = exc


def _answers(client) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
