"""Content-addressed file store: bytes live under their sha256, never under a user's file name."""

from __future__ import annotations

import hashlib
import os
import tempfile
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
