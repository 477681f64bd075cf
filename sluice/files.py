"""Local state is private to the user running Sluice: the data directory 0700, its files 0600.

An indexed secret sits in the job database, in ``chroma.sqlite3`` and in the queue's append-only
file; under the common umask 022 each of them would be readable by every local user. Processes
that write there set ``PRIVATE_UMASK`` at start (``use_private_umask``), and the directories are
created (or tightened) with ``private_dir``, so files written by other programs into them (Chroma,
Redis, SQLite's journals) are private too.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from sluice.errors import SettingsError

PRIVATE_UMASK = 0o077


def use_private_umask() -> None:
    """Files this process (and any program it starts) creates are readable by its user only."""
    os.umask(PRIVATE_UMASK | os.umask(PRIVATE_UMASK))


def private_dir(path: Path) -> Path:
    """Create ``path`` (with parents) and make it and every new parent 0700; tighten it if it
    exists."""
    path = Path(path)
    missing = []
    probe = path
    while not probe.exists() and probe != probe.parent:
        missing.append(probe)
        probe = probe.parent
    path.mkdir(parents=True, exist_ok=True)
    for folder in [*missing, path]:
        try:
            if folder.stat().st_uid == os.getuid() and folder.stat().st_mode & 0o077:
                folder.chmod(0o700)
        except OSError:
            pass
    return path


def write_private(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` with mode 0600 from the first byte (never readable in between)."""
    path = Path(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, text.encode("utf-8"))
    finally:
        os.close(fd)
    return path


def shared_secret(path: Path) -> str:
    """The secret kept in ``path`` (0600, in a 0700 folder), made on first use by whichever process
    asks first: written to a temporary file and linked into place, so every process that races to
    make it ends up reading the same value, and nobody ever reads a half-written one."""
    path = Path(path)
    if not path.exists():
        private_dir(path.parent)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        write_private(tmp, secrets.token_urlsafe(32) + "\n")
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass  # another process made it first: its value is the one
        finally:
            tmp.unlink()
    value = path.read_text(encoding="utf-8").strip()
    if not value:
        raise SettingsError(f"{path} is empty: delete it to have a new secret made, or write one")
    return value


def private_file(path: Path) -> Path:
    """Create ``path`` empty as 0600 if it does not exist; tighten it if it does."""
    path = Path(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)
    return path
