"""Content-addressed file store: bytes live under their sha256, never under a user's file name.

Two backends share one interface: ``LocalBlobStore`` (a directory on this host, the default) and
``sluice.storage.s3_blobs.S3BlobStore`` (any S3-compatible object store, for several hosts). The
Context picks one by ``SLUICE_BLOB_STORE``.

Removing a blob races an upload of the same bytes (in any dataset): the upload finds the blob
there, the removal decides nobody uses it and deletes it, the upload's document then names bytes
that are gone. Both sides keep a second name for the bytes across their database look: an upload
keeps its own copy (``receive`` returns it as ``held``) until its document is committed
(``keep``); a removal moves the blob aside, looks again, and puts it back when a user appeared
(``retire``, ``unretire``). Whichever way the two interleave, a committed document finds its blob.
"""

from __future__ import annotations

import hashlib
import io
import os
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from sluice.files import private_dir

CHUNK = 1024 * 1024
HEX = frozenset("0123456789abcdef")


class Readable(Protocol):
    """What an upload's bytes come from: a file, a request body, a stream with a head put back."""

    def read(self, n: int = -1, /) -> bytes: ...


class BlobTooLarge(Exception):
    def __init__(self, limit: int, seen: int) -> None:
        super().__init__(f"upload is larger than the limit of {limit} bytes (read {seen} so far)")
        self.limit = limit
        self.seen = seen


class BlobMissing(LookupError):
    """The store has no blob under this key."""


def is_key(key: str) -> bool:
    return len(key) == 64 and all(c in HEX for c in key)


def check_key(key: str) -> str:
    if not is_key(key):
        raise ValueError(f"not a blob key: {key!r}")
    return key


@dataclass
class Received:
    """Bytes stored under their key, with the upload's own second name for them (``held``) that
    ``keep`` or ``release`` drops."""

    key: str
    size: int
    held: object


@dataclass
class Swept:
    """What ``BlobStore.sweep`` removed: staged uploads, aborted multipart uploads, and retired
    blobs (put back first when their key had no object: a removal that died in between)."""

    store: str
    staged: int = 0
    multipart: int = 0
    retired: int = 0
    restored: int = 0
    kept_young: int = 0  # leftovers younger than the bound (perhaps still in progress)

    @property
    def removed(self) -> int:
        return self.staged + self.multipart + self.retired

    def describe(self) -> str:
        return (
            f"{self.store}: {self.staged} staged upload(s), {self.multipart} unfinished multipart "
            f"upload(s) and {self.retired} retired blob(s) removed ({self.restored} put back "
            f"under their key first); {self.kept_young} younger than the bound left alone"
        )


class BlobStore:
    """What every backend offers. Keys are sha256 hex digests."""

    kind = "?"

    def describe(self) -> str:
        raise NotImplementedError

    def receive(self, stream: Readable, *, max_bytes: int) -> Received:
        """Store a stream under its sha256; refuse it once it passes ``max_bytes`` (nothing is
        kept then). The caller ends with ``keep`` (its document is committed) or ``release``."""
        raise NotImplementedError

    def keep(self, key: str, held: object) -> None:
        """The upload's document is committed: the blob is there again if a removal took it
        meanwhile, and the upload's second name is dropped."""
        raise NotImplementedError

    def release(self, held: object) -> None:
        raise NotImplementedError

    def exists(self, key: str) -> bool:
        raise NotImplementedError

    def delete(self, key: str) -> bool:
        raise NotImplementedError

    def retire(self, key: str) -> object | None:
        """Move the blob aside before the last look at its users (None: it is gone already)."""
        raise NotImplementedError

    def unretire(self, key: str, aside: object) -> None:
        """A user appeared: the blob comes back."""
        raise NotImplementedError

    def drop(self, aside: object) -> None:
        """Nobody uses the retired blob: remove it for good."""
        raise NotImplementedError

    def keys(self) -> Iterator[str]:
        raise NotImplementedError

    def sweep(self, *, older_than_seconds: float) -> Swept:
        """Remove what uploads and removals that died left behind, older than the bound (a
        younger one may belong to an upload still in progress). The local store has nothing to
        sweep here: its leftovers are files of this host that the host's own processes remove."""
        return Swept(self.describe())

    @contextmanager
    def local_copy(self, key: str) -> Iterator[Path]:
        """A file on this host with the blob's bytes, for the time of the block (BlobMissing)."""
        raise NotImplementedError
        yield Path()  # pragma: no cover

    def read(self, key: str) -> bytes:
        with self.local_copy(key) as path:
            return path.read_bytes()

    def put_stream(self, stream: Readable, *, max_bytes: int) -> tuple[str, int]:
        """Store a stream (no document to commit in between): ``receive`` then ``keep``."""
        got = self.receive(stream, max_bytes=max_bytes)
        self.keep(got.key, got.held)
        return got.key, got.size

    def put_bytes(self, data: bytes, *, max_bytes: int) -> tuple[str, int]:
        return self.put_stream(io.BytesIO(data), max_bytes=max_bytes)


class LocalBlobStore(BlobStore):
    """Blobs in a directory of this host: ``root/ab/cd/abcd...``. The upload's second name and a
    retired blob are hard links beside them."""

    kind = "local"

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def describe(self) -> str:
        return f"local directory {self.root}"

    def path(self, key: str) -> Path:
        check_key(key)
        return self.root / key[:2] / key[2:4] / key

    def exists(self, key: str) -> bool:
        return self.path(key).exists()

    def receive(self, stream: Readable, *, max_bytes: int) -> Received:
        private_dir(self.root)
        digest = hashlib.sha256()
        size = 0
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".hold-")
        try:
            with os.fdopen(fd, "wb") as out:
                while block := stream.read(CHUNK):
                    size += len(block)
                    if size > max_bytes:
                        raise BlobTooLarge(max_bytes, size)
                    digest.update(block)
                    out.write(block)
            key = digest.hexdigest()
            self._link(Path(tmp), key)
            return Received(key, size, Path(tmp))
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def _link(self, source: Path, key: str) -> None:
        final = self.path(key)
        final.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(source, final)
        except FileExistsError:
            pass

    def keep(self, key: str, held: object) -> None:
        assert isinstance(held, Path)
        try:
            self._link(held, key)
        finally:
            held.unlink(missing_ok=True)

    def release(self, held: object) -> None:
        assert isinstance(held, Path)
        held.unlink(missing_ok=True)

    def delete(self, key: str) -> bool:
        try:
            self.path(key).unlink()
            return True
        except FileNotFoundError:
            return False

    def retire(self, key: str) -> Path | None:
        private_dir(self.root)
        aside = self.root / f".retired-{uuid.uuid4().hex}"
        try:
            os.rename(self.path(key), aside)
        except FileNotFoundError:
            return None
        return aside

    def unretire(self, key: str, aside: object) -> None:
        assert isinstance(aside, Path)
        self._link(aside, key)
        aside.unlink(missing_ok=True)

    def drop(self, aside: object) -> None:
        assert isinstance(aside, Path)
        aside.unlink(missing_ok=True)

    def keys(self) -> Iterator[str]:
        if not self.root.exists():
            return
        for path in sorted(self.root.glob("??/??/*")):
            if is_key(path.name) and path.is_file():
                yield path.name

    @contextmanager
    def local_copy(self, key: str) -> Iterator[Path]:
        path = self.path(key)
        if not path.exists():
            raise BlobMissing(key)
        yield path
