"""``sluice run``: every process of the Procfile, their output interleaved, and an ordered stop.

honcho sends SIGTERM to every process at once and SIGKILLs what is left 5 s later, and exits 130
on Ctrl-C (``make`` then says ``Error 130``): the worker meets a Chroma and a Redis that are going
away. Here a stop (Ctrl-C, SIGTERM) goes in two steps: first the front ends and the worker (which
finishes or hands back its jobs, ``worker.consumer``), then the servers they use
(queue, cache, chroma). It exits 0 when every process stopped when asked.

Run from ``make run``, it takes the terminal's foreground while it runs: Ctrl-C then reaches it
alone, not ``make`` too (make would die of the SIGINT whatever its recipe did).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

from sluice.settings import env_file

SERVERS = ("queue", "cache", "chroma")  # started first, stopped last
STOP_SECONDS = 10.0  # each step's wait before SIGKILL (the worker's own grace is shorter)


@dataclass
class Child:
    name: str
    command: str
    proc: subprocess.Popen | None = None
    killed: bool = False
    pump: threading.Thread | None = field(default=None, repr=False)

    @property
    def started(self) -> subprocess.Popen:
        """Its process: every child is started before any is waited for or stopped."""
        if self.proc is None:
            raise RuntimeError(f"{self.name} was never started")
        return self.proc


def read_env_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines of a ``.env`` (comments, blank lines and ``export`` skipped; one pair of
    quotes around a value removed), as honcho reads the one beside the Procfile."""
    values: dict[str, str] = {}
    if not path.is_file():
        return values
    for line in path.read_text().splitlines():
        line = line.strip()
        if line.startswith("export "):
            line = line[len("export ") :].strip()
        key, sep, value = line.partition("=")
        if not sep or not key.strip() or key.lstrip().startswith("#"):
            continue
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        values[key.strip()] = value
    return values


def read_procfile(path: Path) -> list[Child]:
    children = []
    for line in path.read_text().splitlines():
        name, sep, command = line.partition(":")
        if sep and name.strip() and not name.lstrip().startswith("#") and command.strip():
            children.append(Child(name.strip(), command.strip()))
    return children


class Supervisor:
    def __init__(
        self,
        children: list[Child],
        *,
        env: dict[str, str] | None = None,
        out=None,
        stop_seconds: float = STOP_SECONDS,
    ):
        self.env = env
        order = {name: i for i, name in enumerate(SERVERS)}
        self.children = sorted(children, key=lambda c: order.get(c.name, len(SERVERS)))
        self.out = out or sys.stdout
        self.stop_seconds = stop_seconds
        self.width = max([len(c.name) for c in children] + [6])
        self.stop = threading.Event()
        self.asked = False  # the stop was asked for (a signal), not caused by a process ending
        self._lock = threading.Lock()

    def say(self, name: str, text: str) -> None:
        with self._lock:
            self.out.write(f"{time.strftime('%H:%M:%S')} {name:<{self.width}} | {text}\n")
            self.out.flush()

    def start(self) -> None:
        for child in self.children:
            child.proc = subprocess.Popen(
                ["/bin/sh", "-c", f"exec {child.command}"],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
                start_new_session=True,  # a Ctrl-C reaches the supervisor, which stops in order
            )
            child.pump = threading.Thread(target=self._pump, args=(child,), daemon=True)
            child.pump.start()
            self.say("system", f"{child.name} started (pid={child.proc.pid})")

    def _pump(self, child: Child) -> None:
        assert child.proc is not None and child.proc.stdout is not None
        for raw in iter(child.proc.stdout.readline, b""):
            self.say(child.name, raw.decode(errors="replace").rstrip("\n"))
        code = child.proc.wait()
        self.say("system", f"{child.name} stopped (rc={code})")
        self.stop.set()  # one process ending ends the others, as under honcho

    def ask_stop(self, signum: int, _frame=None) -> None:
        if self.asked:  # a second Ctrl-C: no more waiting
            self.stop_seconds = 0.0
        self.asked = True
        self.say("system", f"{signal.Signals(signum).name} received: stopping in order")
        self.stop.set()

    def wait(self) -> int:
        """Until a stop is asked or a process ends; then the ordered stop. Returns the exit code."""
        while not self.stop.wait(0.5):
            pass
        crashed = [c.name for c in self.children if c.started.poll() is not None]
        self._stop_step([c for c in self.children if c.name not in SERVERS])
        self._stop_step([c for c in self.children if c.name in SERVERS])
        for child in self.children:
            if child.pump is not None:
                child.pump.join(2)
        if crashed and not self.asked:
            self.say("system", f"stopped because {', '.join(crashed)} ended")
            return 1
        bad = [c.name for c in self.children if c.killed or c.started.returncode not in (0, -15)]
        if bad:
            self.say("system", f"not stopped cleanly: {', '.join(bad)}")
        return 1 if bad else 0

    def _stop_step(self, group: list[Child]) -> None:
        running = [c for c in group if c.started.poll() is None]
        for child in running:
            self.say("system", f"sending SIGTERM to {child.name}")
            with suppress(ProcessLookupError):
                os.killpg(child.started.pid, signal.SIGTERM)
        deadline = time.monotonic() + self.stop_seconds
        for child in running:
            try:
                child.started.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.say("system", f"{child.name} did not stop: SIGKILL")
                child.killed = True
                with suppress(ProcessLookupError):
                    os.killpg(child.started.pid, signal.SIGKILL)
                child.started.wait(10)


@contextmanager
def terminal_foreground():
    """While the block runs, this process's own group is the terminal's foreground (when it was in
    the foreground): Ctrl-C goes to it alone. Given back afterwards."""
    try:
        fd = sys.stdin.fileno()
        before = os.tcgetpgrp(fd)
    except (OSError, ValueError):
        yield
        return
    if before != os.getpgrp():  # in the background, or no terminal of ours
        yield
        return
    old = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    try:
        with suppress(OSError):
            os.setpgid(0, 0)
            os.tcsetpgrp(fd, os.getpgrp())
        yield
    finally:
        with suppress(OSError):
            os.tcsetpgrp(fd, before)
        signal.signal(signal.SIGTTOU, old)


def child_env(procfile: Path) -> dict[str, str]:
    """The processes' environment: this one, the configuration file beside the Procfile (as
    honcho read it, and named to them so that each reads the same), and this Python's bin folder
    first on PATH, so that the Procfile's ``sluice`` is this installation's."""
    env = dict(os.environ)
    found = env_file(procfile.resolve().parent)
    if found is not None:
        env.update(read_env_file(found))
        env["SLUICE_ENV_FILE"] = str(found.resolve())
    bin_dir = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join(
        [bin_dir, *(p for p in env.get("PATH", "").split(os.pathsep) if p)]
    )
    return env


def run(procfile: Path) -> int:
    supervisor = Supervisor(read_procfile(procfile), env=child_env(procfile))
    with terminal_foreground():
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, supervisor.ask_stop)
        supervisor.start()
        return supervisor.wait()
