"""A real ``sluice serve api`` from start to stop: ``/v1/health`` says ``ready`` only once the
warm-up finished (held open here by the ``api_warm_up`` fault point), and a SIGINT while an event
stream is open ends the stream with a last comment and the process at once, cleanly."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.support.api_server import ApiServer, auth, make_key

pytestmark = pytest.mark.timeout(180)
STOP_WITHIN = 5.0


def _until(check, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout} s: {what}")


def test_health_is_not_ready_until_the_warm_up_finished(sluice_env, tmp_path):
    go = tmp_path / "warm"
    env = {**os.environ, "SLUICE_FAULTS": f"api_warm_up=wait:{go}"}
    api = ApiServer(env, tmp_path / "api.log")
    api.start()  # answers 200 at once, also while it warms up: a liveness check stays green
    try:
        _until(Path(f"{go}.waiting").exists, 30, "the warm-up reached its last step")
        cold = httpx.get(f"{api.url}/v1/health", timeout=10)
        assert cold.status_code == 200
        assert cold.json()["ready"] is False, cold.json()
        go.touch()  # the warm-up finishes
        warm = _until(
            lambda: (r := httpx.get(f"{api.url}/v1/health", timeout=10)).json()["ready"] and r,
            10,
            "health said ready",
        )
        assert warm.status_code == 200 and warm.json()["status"] == "ok"
    finally:
        go.touch()
        api.stop()


def test_sigint_with_an_open_stream_stops_at_once_and_cleanly(sluice_env, tmp_path):
    token = make_key("watcher", datasets=None, scope="read")
    api = ApiServer(dict(os.environ), tmp_path / "api.log")
    api.start()
    try:
        timeout = httpx.Timeout(30, read=20)
        with (
            httpx.Client(timeout=timeout) as client,
            # ``seconds`` bounds the stream where nothing else ends it (the code before the change)
            client.stream(
                "GET", f"{api.url}/v1/events", headers=auth(token), params={"seconds": "30"}
            ) as r,
        ):
            lines = r.iter_lines()
            assert next(lines) == "retry: 2000"
            os.kill(api.pid, signal.SIGINT)  # Ctrl-C
            asked = time.monotonic()
            rest = [line for line in lines if line]
        try:
            code = api.proc.wait(STOP_WITHIN)
        except subprocess.TimeoutExpired:
            code = None
        took = time.monotonic() - asked
    finally:
        api.kill9()
    output = api.output()
    assert code == 0, f"still running {took:.1f} s after SIGINT (code {code}):\n{output[-2000:]}"
    assert took < STOP_WITHIN
    assert rest == [": closed: the API is stopping"], rest
    assert "Traceback" not in output and "ERROR" not in output, output[-3000:]
