"""Content-addressed file store: bytes live under their sha256, never under a user's file name."""

from __future__ import annotations

import hashlib
import os
import tempfile
import uuid
from pathlib import Path
from typing import BinaryIO

from sluice.files import private_dir

CHUNK = 1024 * 1024


class BlobTooLarge(Exception):
    def __init__(self, limit: int, seen: int) -> None:
        super().__init__(f"upload is larger than the limit of {limit} bytes (read {seen} so far)")
        self.limit = limit
        self.seen = seen


class BlobStore:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def path(self, key: str) -> Path:
        if len(key) != 64 or any(c not in "0123456789abcdef" for c in key):
            raise ValueError(f"not a blob key: {key!r}")
        return self.root / key[:2] / key[2:4] / key

    def exists(self, key: str) -> bool:
        return self.path(key).exists()

    def put_stream(self, stream: BinaryIO, *, max_bytes: int) -> tuple[str, int]:
        """Store a stream; refuse it once it passes ``max_bytes`` (nothing is kept then)."""
        private_dir(self.root)
        digest = hashlib.sha256()
        size = 0
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".upload-")
        try:
            with os.fdopen(fd, "wb") as out:
                while True:
                    block = stream.read(CHUNK)
                    if not block:
                        break
                    size += len(block)
                    if size > max_bytes:
                        raise BlobTooLarge(max_bytes, size)
                    digest.update(block)
                    out.write(block)
            key = digest.hexdigest()
            final = self.path(key)
            if final.exists():
                os.unlink(tmp)
            else:
                final.parent.mkdir(parents=True, exist_ok=True)
                os.replace(tmp, final)
            return key, size
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise

    def put_bytes(self, data: bytes, *, max_bytes: int) -> tuple[str, int]:
        import io

        return self.put_stream(io.BytesIO(data), max_bytes=max_bytes)

    def read(self, key: str) -> bytes:
        return self.path(key).read_bytes()

    def delete(self, key: str) -> bool:
        try:
            self.path(key).unlink()
            return True
        except FileNotFoundError:
            return False

    # Removing a blob races an upload of the same bytes (in any dataset): the upload finds the file
    # there, the removal decides nobody uses it and deletes it, the upload's document then names a
    # file that is gone. Both sides keep a second name for the bytes across their database look:
    # an upload holds a hard link until its document is committed (``hold``, ``keep``); a removal
    # renames the blob aside, looks again, and puts it back when a user appeared (``retire``,
    # ``unretire``). Whichever way the two interleave, a committed document finds its file.

    def _aside(self, prefix: str) -> Path:
        private_dir(self.root)
        return self.root / f".{prefix}-{uuid.uuid4().hex}"

    def hold(self, key: str) -> Path | None:
        """A second name for the blob's bytes while an upload commits (None: it is gone)."""
        held = self._aside("hold")
        try:
            os.link(self.path(key), held)
        except FileNotFoundError:
            return None
        return held

    def keep(self, key: str, held: Path | None) -> None:
        """The upload's document is committed: put the held bytes back if a removal took the blob
        meanwhile, and drop the second name."""
        if held is None:
            return
        final = self.path(key)
        try:
            final.parent.mkdir(parents=True, exist_ok=True)
            os.link(held, final)
        except FileExistsError:
            pass
        finally:
            held.unlink(missing_ok=True)

    def release(self, held: Path | None) -> None:
        if held is not None:
            held.unlink(missing_ok=True)

    def retire(self, key: str) -> Path | None:
        """Rename the blob aside before the last look at its users (None: it is gone already)."""
        aside = self._aside("retired")
        try:
            os.rename(self.path(key), aside)
        except FileNotFoundError:
            return None
        return aside

    def unretire(self, key: str, aside: Path) -> None:
        """A user appeared: the blob comes back (unless an upload has stored it again already)."""
        final = self.path(key)
        try:
            os.link(aside, final)
        except FileExistsError:
            pass
        aside.unlink(missing_ok=True)
