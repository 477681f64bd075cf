"""Every entry point reads one configuration the same way: SLUICE_ENV_FILE, else the user's own
./.env; a command that would make a job database nobody runs on says so; `sluice run` finds its
own `sluice` without the venv on PATH."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sluice.servers import supervisor


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    return {**env, **extra}


def _sluice(cwd: Path, *argv: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sluice.cli", *argv],
        cwd=cwd,
        env=_clean_env(**env),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_command_in_the_systems_folder_reads_its_env_file(tmp_path):
    (tmp_path / ".env").write_text(f"SLUICE_DATA_DIR={tmp_path / 'data'}\n")
    (tmp_path / ".env").chmod(0o600)
    made = _sluice(tmp_path, "keys", "create", "app", "--all-datasets", "--scope", "read")
    assert made.returncode == 0, made.stderr
    assert (tmp_path / "data" / "sluice.db").exists()
    assert not (tmp_path / "var").exists()  # before: a new ./var/sluice.db, the key answered 401
    listed = _sluice(tmp_path, "keys", "list")
    assert listed.returncode == 0 and "app" in listed.stdout
    assert "made a new job database" not in listed.stderr


def test_an_env_file_others_may_write_is_ignored_and_a_new_database_is_named(tmp_path):
    (tmp_path / ".env").write_text(f"SLUICE_DATA_DIR={tmp_path / 'elsewhere'}\n")
    (tmp_path / ".env").chmod(0o666)
    made = _sluice(tmp_path, "keys", "list")
    assert made.returncode == 0, made.stderr
    assert not (tmp_path / "elsewhere").exists()
    assert "ignoring" in made.stderr and "chmod go-w" in made.stderr
    assert "made a new job database at" in made.stderr and "sluice.db" in made.stderr


def test_sluice_env_file_wins_over_the_local_one(tmp_path):
    (tmp_path / ".env").write_text(f"SLUICE_DATA_DIR={tmp_path / 'local'}\n")
    (tmp_path / ".env").chmod(0o600)
    named = tmp_path / "named.env"
    named.write_text(f"SLUICE_DATA_DIR={tmp_path / 'named'}\n")
    done = _sluice(tmp_path, "keys", "list", SLUICE_ENV_FILE=str(named))
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "named" / "sluice.db").exists() and not (tmp_path / "local").exists()


@pytest.mark.timeout(120)
def test_sluice_run_finds_its_own_sluice_without_the_venv_on_path(tmp_path):
    procfile = tmp_path / "Procfile"
    procfile.write_text("probe: sluice --help\n")
    (tmp_path / ".env").write_text(f"SLUICE_DATA_DIR={tmp_path / 'data'}\n")
    (tmp_path / ".env").chmod(0o600)
    env = _clean_env(PATH="/usr/bin:/bin")
    done = subprocess.run(
        [sys.executable, "-m", "sluice.cli", "run", "--procfile", str(procfile)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert "not found" not in done.stdout, done.stdout
    assert "usage: sluice" in done.stdout, done.stdout


def test_the_processes_of_sluice_run_are_told_which_file_configured_them(tmp_path, monkeypatch):
    procfile = tmp_path / "Procfile"
    procfile.write_text("probe: true\n")
    (tmp_path / ".env").write_text("SLUICE_QUEUE_NAME=elsewhere\n")
    (tmp_path / ".env").chmod(0o600)
    monkeypatch.delenv("SLUICE_ENV_FILE", raising=False)
    env = supervisor.child_env(procfile)
    assert env["SLUICE_ENV_FILE"] == str((tmp_path / ".env").resolve())
    assert env["SLUICE_QUEUE_NAME"] == "elsewhere"
    assert env["PATH"].split(os.pathsep)[0] == str(Path(sys.executable).parent)
