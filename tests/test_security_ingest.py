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


def test_sluice_ingest_keeps_the_dataset_name_rule(ctx, tmp_path):
    """Suspected in issue 26: `--dataset NAME` skipped the rule the console's Create applies, and
    the name reached Markdown (a code span on the Datasets page) as it was. The real command."""
    from sluice.storage.models import Dataset

    doc = tmp_path / "notes.txt"
    doc.write_text("Harbour pilots board ships near the breakwater. " * 20)
    hostile = "x` [Session expired, sign in again](https:evil.example) `"
    done = sluice("ingest", str(doc), "--dataset", hostile)
    assert done.returncode != 0 and "is not a dataset name" in done.stdout + done.stderr
    with Session(ctx.engine) as session:
        assert hostile not in {d.name for d in session.exec(select(Dataset)).all()}
    assert sluice("ingest", str(doc), "--dataset", "harbour-2024").returncode == 0
