"""Throwaway servers for the test suite: Redis and Chroma on free ports, huey consumers.

Everything here is started by the tests themselves, on ports they picked, in folders they own;
nothing touches a Redis or Chroma the suite did not start.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import redis

from sluice.servers.processes import chroma_argv, free_loopback_port, redis_argv, wait_listening

ROOT = Path(__file__).resolve().parents[2]


free_port = free_loopback_port


def wait_port(port: int, timeout: float = 20.0) -> None:
    wait_listening(port, timeout)


class ManagedProcess:
    def __init__(
        self, argv: list[str], *, log: Path, env: dict | None = None, cwd: Path | None = None
    ) -> None:
        self.argv, self.log, self.env, self.cwd = argv, log, env, cwd
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        fh = open(self.log, "ab")
        self.proc = subprocess.Popen(
            self.argv,
            stdout=fh,
            stderr=subprocess.STDOUT,
            env=self.env,
            cwd=self.cwd or ROOT,
            start_new_session=True,
        )
        fh.close()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> None:
        if self.alive():
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self, timeout: float = 10) -> None:
        if not self.alive():
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout)
        except (subprocess.TimeoutExpired, ProcessLookupError):
            self.kill9()

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


class RedisServer(ManagedProcess):
    def __init__(self, role: str, workdir: Path) -> None:
        self.port = free_port()
        self.role = role
        # Sluice's Redis always requires a password; the suite's carry theirs in the URL, as on
        # several hosts, so every test's own data directory reaches them.
        self.url = f"redis://:{secrets.token_urlsafe(16)}@127.0.0.1:{self.port}/0"
        super().__init__(
            redis_argv(role, url=self.url, data_dir=workdir), log=workdir / f"redis-{role}.log"
        )

    def start(self) -> None:
        super().start()
        deadline = time.monotonic() + 20
        while True:
            try:
                redis.Redis.from_url(self.url).ping()
                return
            except redis.RedisError:
                if time.monotonic() > deadline or not self.alive():
                    raise RuntimeError(
                        f"redis {self.role} did not start:\n{self.output()[-2000:]}"
                    ) from None
                time.sleep(0.05)

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url)


class ChromaServer(ManagedProcess):
    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        super().__init__(
            chroma_argv(url=self.url, path=workdir / "chroma"), log=workdir / "chroma.log"
        )

    def start(self) -> None:
        super().start()
        wait_port(self.port, 60)


def consumer_argv(workers: int = 2, kind: str = "thread") -> list[str]:
    exe = str(Path(sys.executable).with_name("huey_consumer"))
    return [
        exe,
        "sluice.worker.hooks.huey",
        "-k",
        kind,
        "-w",
        str(workers),
        "-d",
        "0.05",
    ]


class Consumer(ManagedProcess):
    """A real huey_consumer process; ready once its presence key shows up in the queue Redis."""

    def __init__(self, env: dict, log: Path, *, workers: int = 2, kind: str = "thread") -> None:
        super().__init__(consumer_argv(workers, kind), log=log, env=env)
        self.kind = kind

    def wait_ready(self, queue: redis.Redis, queue_name: str, timeout: float = 60) -> None:
        """Thread consumers announce their own pid; process consumers announce their children."""
        deadline = time.monotonic() + timeout
        pattern = f"sluice.workers.{queue_name}:*"
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(f"consumer exited:\n{self.output()[-3000:]}")
            for key in queue.scan_iter(match=pattern):
                pid = int(key.rsplit(b":", 1)[1])
                if pid == self.pid or (self.kind == "process" and _parent(pid) == self.pid):
                    return
            time.sleep(0.1)
        raise TimeoutError(f"consumer not ready:\n{self.output()[-3000:]}")


def _parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None
