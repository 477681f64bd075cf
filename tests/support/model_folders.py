"""The folders the engine model's sources follow (tests/test_engine_model.py): a few files whose
bytes come from a fixed set, changed only through here, with modification times from a counter so
that a sync sees every edit whatever the file system's clock resolution (never the wall clock).
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

# Relative paths of a folder's files: every basename differs, so a filename filter finds one.
FILES = ("alpha.txt", "bravo.txt", "sub/gamma.txt")


def text(word: str, repeat: int) -> bytes:
    """A file's bytes: every sentence names ``word`` (a search for it finds every chunk) and the
    words of the model's search (tides, harbour, ward)."""
    return "".join(
        f"Entry {i}: the {word} of ward {i} by the harbour, with its tides and its lights. "
        * repeat
        + "\n\n"
        for i in range(4)
    ).encode()


def bodies(shared: bytes) -> list[tuple[bytes, str]]:
    """What a source's file may hold, with the word that finds it: ``shared`` first (bytes the
    model also uploads: one blob, two documents), then three texts of the folders' own."""
    own = [
        (text(word, repeat), word) for word, repeat in (("quill", 5), ("ember", 6), ("marsh", 7))
    ]
    return [(shared, "glacier"), *own]


class Folders:
    """One folder per source under ``root``: what each file holds (an index into ``bodies``),
    written to disk with a modification time one second past the last one written."""

    def __init__(self, root: Path, names: tuple[str, ...], contents: list[bytes]) -> None:
        self.root, self.names, self.contents = root, names, contents
        self.files: dict[str, dict[str, int]] = {}
        self.clock = 1_700_000_000 * 10**9

    def reset(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
        self.files = {name: {} for name in self.names}
        for name in self.names:
            self.folder(name).mkdir(parents=True)

    def folder(self, name: str) -> Path:
        return self.root / name

    def write(self, name: str, path: str, body: int) -> None:
        target = self.folder(name) / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(self.contents[body])
        self.clock += 10**9
        os.utime(target, ns=(self.clock, self.clock))
        self.files[name][path] = body

    def change(self, name: str, what: str, n: int, body: int) -> str | None:
        """``add`` a file at a free path, ``edit`` one (other bytes), ``rename`` one to a free path
        (its time kept, as ``mv`` does) or ``remove`` one; ``n`` picks which, ``body`` what an
        added or edited file holds. What was done, or None when there was nothing to do it to."""
        files = self.files[name]
        present = sorted(files)
        free = [p for p in FILES if p not in files]
        if what == "add" and free:
            path = free[n % len(free)]
            self.write(name, path, body)
            return f"add {path}"
        if not present or what == "add":
            return None
        path = present[n % len(present)]
        if what == "edit":  # to bytes no file of the folder holds: two files of one source
            # with the same bytes share one document, which the entries' invariants do not model
            # (test_engine_model's replay of such an edit checks that it orphans nothing)
            free_bodies = [b for b in range(len(self.contents)) if b not in files.values()]
            if not free_bodies:
                return None
            body = free_bodies[body % len(free_bodies)]
            self.write(name, path, body)
            return f"edit {path}"
        if what == "rename" and free:
            new = free[n % len(free)]
            (self.folder(name) / new).parent.mkdir(parents=True, exist_ok=True)
            os.rename(self.folder(name) / path, self.folder(name) / new)
            files[new] = files.pop(path)
            return f"rename {path} {new}"
        if what == "remove":
            (self.folder(name) / path).unlink()
            del files[path]
            return f"remove {path}"
        return None


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
