"""``sluice serve queue|cache|chroma|worker|console|metrics|api``: what the Procfile runs (each but
the Chroma gate exec'd in place)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from sluice.files import private_dir
from sluice.ops.access import check_bind
from sluice.ops.gate import (
    allowed_hosts,
    check_api_bind,
    check_metrics_bind,
    local_link_url,
    mint_local_link,
)
from sluice.servers.processes import chroma_argv, redis_argv
from sluice.settings import get_settings

CONSOLE_APP = Path(__file__).resolve().parent.parent / "console" / "app.py"
CONSOLE_LAUNCHER = "sluice.console.launcher"  # named, not imported, like the API's app
WORKER_MAIN = "sluice.worker.consumer"  # named, not imported: no pipeline at start
METRICS_MAIN = "sluice.exporter"  # named, not imported, like the worker
API_APP = "sluice.api.server:app"  # named, not imported: the front ends do not import each other
# uvicorn's h11 protocol with a deadline for each request head and a cap per address (named too)
API_PROTOCOL = "sluice.api.guard:ConnectionGuard"
# On SIGINT/SIGTERM the API ends its event streams itself (sluice.api.server); a request still
# running this long after is cancelled, so a stop never waits on a slow client.
API_GRACEFUL_SHUTDOWN_SECONDS = 10


def argv_for(what: str, *, workers: int = 2, kind: str = "thread") -> list[str]:
    s = get_settings()
    if what in ("queue", "cache"):
        url = s.queue_redis_url if what == "queue" else s.cache_redis_url
        return redis_argv(what, url=url, data_dir=s.data_dir)
    if what == "worker":  # Huey's consumer with the ordered stop (no job left running, exit 0)
        return [
            sys.executable,
            "-m",
            WORKER_MAIN,
            "-k",
            kind,
            "-w",
            str(workers),
            "-d",
            "0.1",
        ]
    if what == "metrics":  # a small HTTP server over the job database
        check_metrics_bind(s)
        return [sys.executable, "-m", METRICS_MAIN]
    if what == "api":
        check_api_bind(s)
        return [
            sys.executable,
            "-m",
            "uvicorn",
            API_APP,
            "--host",
            s.api_address,
            "--port",
            str(s.api_port),
            "--no-server-header",
            "--http",
            API_PROTOCOL,
            "--ws",
            "none",  # no route speaks WebSocket: an upgrade is an ordinary request
            *_forwarding(s.api_trusted_proxies),
            "--timeout-graceful-shutdown",
            str(API_GRACEFUL_SHUTDOWN_SECONDS),
        ]
    check_bind(s)
    return [
        sys.executable,
        "-m",
        CONSOLE_LAUNCHER,  # Streamlit's command line with the frame headers on every answer
        "run",
        str(CONSOLE_APP),
        "--server.address",
        s.console_address,
        "--server.port",
        str(s.console_port),
        "--server.headless",
        "true",
        "--browser.gatherUsageStats",
        "false",
        "--client.disableDataExport",  # its CSV keeps formulas live: exports go through ops
        "true",
        "--server.maxUploadSize",
        str(max(1, s.max_upload_bytes // (1024 * 1024))),
    ] + [arg for host in sorted(allowed_hosts(s)) for arg in ("--server.allowedHosts", host)]


def _forwarding(proxies: list[str]) -> list[str]:
    """uvicorn's proxy headers for the trusted proxies alone: the client address is the last one
    of ``X-Forwarded-For`` that is none of them (and ``X-Forwarded-Proto`` the scheme), from them
    only. Without any, no forwarded header is believed (uvicorn would trust loopback)."""
    if not proxies:
        return ["--no-proxy-headers"]
    return ["--proxy-headers", "--forwarded-allow-ips", ",".join(proxies)]


def _link(s) -> str:
    return local_link_url(s, mint_local_link(s))


def console_url(args) -> int:
    """``sluice console-url``: a new one-time link to the console, for Sluice's own user."""
    s = get_settings()
    if s.console_password is not None or s.console_sign_in != "auto":
        print(
            "The console signs in with SLUICE_CONSOLE_PASSWORD (or SLUICE_CONSOLE_SIGN_IN is "
            "set): open it at " + local_link_url(s, "").split("?")[0],
            file=sys.stderr,
        )
        return 2
    print(_link(s))
    return 0


def serve(args) -> int:
    s = get_settings()
    private_dir(s.data_dir)
    if args.what == "chroma":  # a gate in front of `chroma run`, which it starts on a loopback port
        from sluice.servers.chroma_gate import serve as serve_chroma

        chroma_argv(url=s.chroma_url, path=s.chroma_dir)  # refuses an address beyond loopback
        return serve_chroma(s)
    argv = argv_for(args.what, workers=args.workers, kind=args.kind)
    if args.what == "console" and s.console_password is None and s.console_sign_in == "auto":
        print(f"Open the console (this link works once): {_link(s)}")
    sys.stdout.flush()
    os.execv(argv[0], argv)
    return 0  # pragma: no cover
