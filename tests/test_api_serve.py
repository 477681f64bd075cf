"""How the API process serves: the keep-alive comment of a quiet event stream, and the bind rule of
``sluice serve api`` (no wildcard address without the names it is reached by)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from sluice.cli.serve import argv_for
from sluice.settings import reset_settings_cache
from tests.support.api_server import InProcessApi, auth, make_key


def test_a_quiet_event_stream_gets_a_keep_alive_comment_every_interval(store_env, monkeypatch):
    monkeypatch.setenv("SLUICE_API_KEEPALIVE_SECONDS", "0.3")  # 15 s in production
    reset_settings_cache()
    token = make_key("listener", datasets=None, scope="read")
    lines: list[tuple[float, str]] = []
    with InProcessApi() as api, httpx.Client(base_url=api.url, timeout=10) as client:
        start = time.monotonic()
        with client.stream("GET", "/v1/events?seconds=1.6", headers=auth(token)) as r:
            assert r.status_code == 200
            lines = [(time.monotonic() - start, line) for line in r.iter_lines() if line]
    comments = [at for at, line in lines if line == ": keep-alive"]
    assert [line for _, line in lines if not line.startswith(":")] == ["retry: 2000"]  # no event
    assert len(comments) >= 3, lines
    assert all(0.25 <= b - a <= 1.0 for a, b in zip(comments, comments[1:], strict=False))


def _serve_api(env: dict[str, str]) -> subprocess.CompletedProcess:
    sluice = str(Path(sys.executable).with_name("sluice"))
    return subprocess.run(
        [sluice, "serve", "api"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_serve_api_refuses_every_interface_without_api_hosts(store_env, monkeypatch):
    for wildcard in ("0.0.0.0", "::"):
        refused = _serve_api({"SLUICE_API_ADDRESS": wildcard, "SLUICE_API_HOSTS": ""})
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert "SLUICE_API_ADDRESS" in refused.stderr and "SLUICE_API_HOSTS" in refused.stderr
        assert "uvicorn running" not in (refused.stdout + refused.stderr).lower()
    monkeypatch.setenv("SLUICE_API_ADDRESS", "0.0.0.0")
    monkeypatch.setenv("SLUICE_API_HOSTS", "api.example.com")
    reset_settings_cache()
    argv = argv_for("api")  # named, the same address starts
    assert argv[argv.index("--host") + 1] == "0.0.0.0"
