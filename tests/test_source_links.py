"""A folder source never reads a file outside its folder through a link, also when a link is
swapped in while the sync runs, and a link loop is skipped instead of failing every sync."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sluice import faults
from sluice.ops.sources import syncing
from sluice.ops.sources.listing import SourceReader, SourceUnreadable

SECRET = b"queue password: hunter2-must-never-be-indexed"


def _share(tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path / "share"
    (root / "docs").mkdir(parents=True)
    (root / "docs" / "a.txt").write_bytes(b"harbour cranes " * 20)
    secret = tmp_path / "private" / "password"
    secret.parent.mkdir()
    secret.write_bytes(SECRET)
    return root, secret


def test_a_link_swapped_in_between_the_listing_and_the_read_is_refused(tmp_path):
    root, secret = _share(tmp_path)
    reader = SourceReader(str(root), [], [])
    assert "docs/a.txt" in reader.listing().files
    (root / "docs" / "a.txt").unlink()
    (root / "docs" / "a.txt").symlink_to(secret)
    with pytest.raises(SourceUnreadable, match="leads out"):
        reader.read("docs/a.txt", max_bytes=10_000)


def test_a_link_swapped_in_at_the_moment_of_the_read_reads_nothing_outside(tmp_path):
    """The window the old check-then-open left: the file is swapped for a link to a private file
    right before the open (a fault point holds the moment)."""
    root, secret = _share(tmp_path)
    reader = SourceReader(str(root), [], [])

    def swap(path: str) -> None:
        target = root / path
        if not target.is_symlink():
            target.unlink()
            target.symlink_to(secret)

    with faults.hook("source_before_read", swap):
        try:
            data, _ = reader.read("docs/a.txt", max_bytes=10_000)
        except SourceUnreadable:
            data = b""
    assert SECRET not in data  # before: the private file's bytes were read and indexed


def test_a_folder_swapped_for_a_link_out_is_refused(tmp_path):
    root, secret = _share(tmp_path)
    (root / "docs" / "a.txt").unlink()
    (root / "docs").rmdir()
    (root / "docs").symlink_to(secret.parent)
    (secret.parent / "a.txt").write_bytes(SECRET)
    with pytest.raises(SourceUnreadable):
        SourceReader(str(root), [], []).read("docs/a.txt", max_bytes=10_000)


def test_a_link_to_a_file_inside_the_folder_is_still_read(tmp_path):
    root, _ = _share(tmp_path)
    (root / "docs" / "b.txt").symlink_to(root / "docs" / "a.txt")
    (root / "rel.txt").symlink_to(Path("docs") / "a.txt")
    reader = SourceReader(str(root), [], [])
    for name in ("docs/b.txt", "rel.txt"):
        data, seen = reader.read(name, max_bytes=10_000)
        assert data == b"harbour cranes " * 20 and seen.size == len(data)


def test_a_link_loop_is_skipped_and_the_sync_succeeds(tmp_path, make_ctx):
    root, _ = _share(tmp_path)
    os.symlink(root / "loop-b.txt", root / "loop-a.txt")
    os.symlink(root / "loop-a.txt", root / "loop-b.txt")
    listing = SourceReader(str(root), [], []).listing()
    assert listing.error is None and set(listing.files) == {"docs/a.txt"}
    ctx = make_ctx()
    syncing.add_source(ctx, name="src", dataset="docs", folder=str(root))
    result = syncing.sync(ctx, "src", actor="test", confirm=True)
    assert result.counts["added"] == 1, result  # before: RuntimeError, the run left "running"
