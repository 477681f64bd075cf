"""``sluice ingest DIR`` takes what is in the folder: a link out of it is skipped, and said so,
unless ``--follow-links`` asks for it. Run as the real command on a real folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from sqlmodel import Session, select

from sluice.storage.models import Document

SECRET = "The root password of the payroll server is hunter2-7734."


def sluice(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "sluice.cli.main", *args],
        env=os.environ,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


def names(ctx) -> set[str]:
    with Session(ctx.engine) as session:
        return {d.filename for d in session.exec(select(Document)).all()}


def test_links_out_of_the_folder_are_skipped_unless_asked(ctx, tmp_path):
    private = tmp_path / "private"
    private.mkdir()
    (private / "secret.txt").write_text(SECRET * 10)
    (private / "more.md").write_text("# Private notes\n\n" + SECRET * 10)
    folder = tmp_path / "upload"
    (folder / "sub").mkdir(parents=True)
    (folder / "notes.txt").write_text("Lighthouse keepers log the weather every four hours. " * 20)
    (folder / "sub" / "inside.txt").write_text(
        "Ferries leave the harbour at dawn and at dusk. " * 20
    )
    (folder / "leak.txt").symlink_to(private / "secret.txt")
    (folder / "private-dir").symlink_to(private, target_is_directory=True)
    (folder / "alias.txt").symlink_to(folder / "sub" / "inside.txt")  # stays inside: fine

    done = sluice("ingest", str(folder), "--json")
    assert done.returncode == 0, done.stderr
    assert names(ctx) & {"leak.txt", "secret.txt", "more.md"} == set()
    assert "notes.txt" in names(ctx) and names(ctx) & {
        "alias.txt",
        "inside.txt",
    }  # a link inside is fine
    assert (
        "leak.txt" in done.stderr
        and "private-dir" in done.stderr
        and "--follow-links" in done.stderr
    )
    assert SECRET not in done.stdout
    assert all(r["filename"] != "leak.txt" for r in json.loads(done.stdout))

    followed = sluice("ingest", str(folder), "--follow-links")
    assert followed.returncode == 0, followed.stderr
    assert {"leak.txt", "more.md"} <= names(ctx)
