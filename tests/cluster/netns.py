"""Hosts for the cluster run: Linux network namespaces joined by one bridge, each with its own
address, host name (a UTS namespace per process tree) and data directory, and no shared disk.

The test creates every namespace, link and the bridge itself and removes them at the end, also
after a failure; traffic goes only between them (nothing is routed beyond the bridge).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

BRIDGE = "slc-br0"
SUBNET = "10.231.77"  # a private /24 no interface of this machine uses
GATEWAY = f"{SUBNET}.1"  # the bridge's own address: the test process reaches the hosts by it


def sh(*argv: str, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=check, capture_output=True, text=True, timeout=60, **kwargs)


@dataclass
class Host:
    name: str  # also its namespace and host name
    ip: str
    root: Path  # its own disk: $SLUICE_DATA_DIR and logs
    procs: list[subprocess.Popen] = field(default_factory=list)

    @property
    def ns(self) -> str:
        return f"slc-{self.name}"

    @property
    def link(self) -> str:
        """The bridge's end of the host's cable."""
        return f"slc-{self.name}-br"

    def run(self, argv: list[str], env: dict[str, str], **kwargs) -> subprocess.CompletedProcess:
        """A command on this host, waited for."""
        return subprocess.run(
            ["ip", "netns", "exec", self.ns, *argv],
            env=env,
            capture_output=True,
            text=True,
            timeout=kwargs.pop("timeout", 120),
            **kwargs,
        )

    def start(
        self, what: str, argv: list[str], env: dict[str, str], user: str | None = None
    ) -> subprocess.Popen:
        """A long-running process on this host under its host name; output in root/<what>.log."""
        log = open(self.root / f"{what}.log", "ab")
        inner = ["runuser", "-u", user, "--", *argv] if user else argv
        proc = subprocess.Popen(
            [
                *("ip", "netns", "exec", self.ns, "unshare", "--uts", "sh", "-c"),
                f'hostname {self.name} && exec "$@"',
                "sh",
                *inner,
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        self.procs.append(proc)
        return proc

    def pids(self) -> list[int]:
        out = sh("ip", "netns", "pids", self.ns, check=False).stdout
        return [int(p) for p in out.split()]

    def kill_all(self) -> int:
        """SIGKILL every process of the host at once (a host that dies); how many there were."""
        pids = self.pids()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for proc in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                pass
        return len(pids)

    def cut(self) -> None:
        sh("ip", "link", "set", self.link, "down")

    def join(self) -> None:
        sh("ip", "link", "set", self.link, "up")

    def log(self, what: str) -> str:
        path = self.root / f"{what}.log"
        return path.read_text(errors="replace") if path.exists() else ""


class Network:
    """The bridge and the hosts on it; ``close`` removes all of it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.hosts: dict[str, Host] = {}

    def __enter__(self) -> Network:
        self.close()  # what a killed earlier run may have left
        sh("ip", "link", "add", BRIDGE, "type", "bridge")
        sh("ip", "addr", "add", f"{GATEWAY}/24", "dev", BRIDGE)
        sh("ip", "link", "set", BRIDGE, "up")
        return self

    def add(self, name: str, last_octet: int) -> Host:
        host = Host(name, f"{SUBNET}.{last_octet}", self.root / name)
        host.root.mkdir(parents=True, exist_ok=True)
        inner = f"slc-{name}-if"
        sh("ip", "netns", "add", host.ns)
        sh("ip", "link", "add", host.link, "type", "veth", "peer", "name", inner)
        sh("ip", "link", "set", inner, "netns", host.ns)
        sh("ip", "link", "set", host.link, "master", BRIDGE)
        sh("ip", "link", "set", host.link, "up")
        for argv in (
            ["ip", "link", "set", "lo", "up"],
            ["ip", "addr", "add", f"{host.ip}/24", "dev", inner],
            ["ip", "link", "set", inner, "up"],
        ):
            sh("ip", "netns", "exec", host.ns, *argv)
        self.hosts[name] = host
        return host

    def close(self) -> None:
        """Every process, namespace, cable and the bridge this run (or an earlier one) made."""
        listed = sh("ip", "netns", "list", check=False).stdout.split()
        for ns in [n for n in listed if n.startswith("slc-")]:
            deadline = time.monotonic() + 10
            while pids := sh("ip", "netns", "pids", ns, check=False).stdout.split():
                for pid in pids:
                    try:
                        os.kill(int(pid), signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                if time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            sh("ip", "netns", "del", ns, check=False)
        for line in sh("ip", "-o", "link", "show", check=False).stdout.splitlines():
            name = line.split(":")[1].strip().split("@")[0]
            if name.startswith("slc-"):  # a cable's end outlives its namespace for a moment
                sh("ip", "link", "del", name, check=False)

    def __exit__(self, *exc: object) -> None:
        self.close()
