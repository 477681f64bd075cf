"""What a source holds: a folder walked with ``os.scandir`` or an S3 prefix listed page by page,
each file by its source-relative path with its size and modification time; and reading one file's
bytes so that what is hashed is what was read.

A folder's links are followed only when they point at a file inside the folder (a link out of it
would index a private file); linked folders are never walked, and a link loop is skipped with a
warning. A file is opened one path part at a time from a handle on the folder, none of them
followed if it is a link, so a link swapped in between the check and the open leads nowhere.
Names starting with a dot are skipped (editors' swap files, ``.git``). Without ``--include`` only
the file types Sluice reads are listed.
"""

from __future__ import annotations

import errno
import fnmatch
import logging
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from sluice import faults
from sluice.ops.ingest import SUPPORTED_SUFFIXES
from sluice.settings import Settings

log = logging.getLogger(__name__)
BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
LINK_HOPS = 8  # links followed to reach one file, at most (a loop ends here)


class SourceUnreadable(OSError):
    """One file of a source could not be read (gone, no permission, too large)."""


@dataclass(frozen=True)
class Seen:
    size: int
    mtime_ns: int
    # An object store's ETag ("" for a folder): S3 gives times to the second, so an edit of the same
    # size within that second changes only the ETag
    etag: str = ""


@dataclass
class Listing:
    files: dict[str, Seen] = field(default_factory=dict)
    error: str | None = None  # the listing failed: what it holds is incomplete


def parse_s3(location: str) -> tuple[str, str]:
    """``s3://bucket/prefix`` -> (bucket, prefix); ValueError names what is wrong."""
    if not location.startswith("s3://"):
        raise ValueError(f"{location!r} is not an s3://bucket/prefix address")
    bucket, _, prefix = location[5:].partition("/")
    if not bucket:
        raise ValueError(f"{location!r} names no bucket (s3://bucket/prefix)")
    if not BUCKET.match(bucket):  # an ARN or an access point would send requests to other hosts
        raise ValueError(f"{bucket!r} is not an S3 bucket name (3-63 of a-z, 0-9, '.' and '-')")
    if prefix and not prefix.endswith("/"):
        prefix += "/"
    return bucket, prefix


def wanted(path: str, include: list[str], exclude: list[str]) -> bool:
    name = path.rsplit("/", 1)[-1]
    if any(part.startswith(".") for part in path.split("/")):
        return False
    if include:
        ok = any(fnmatch.fnmatchcase(path, g) or fnmatch.fnmatchcase(name, g) for g in include)
    else:
        ok = os.path.splitext(name)[1].lower() in SUPPORTED_SUFFIXES
    if not ok:
        return False
    return not any(fnmatch.fnmatchcase(path, g) or fnmatch.fnmatchcase(name, g) for g in exclude)


class SourceReader:
    """A source's listing and its files' bytes (a folder here, an S3 prefix in ``S3Reader``)."""

    def __init__(self, location: str, include: list[str], exclude: list[str]) -> None:
        self.location = location
        self.include = include
        self.exclude = exclude

    def listing(self) -> Listing:
        root = Path(self.location)
        out = Listing()
        try:
            if not root.is_dir():
                raise FileNotFoundError(f"{root} is not a folder")
            for rel, seen in self._walk(root.resolve(), ""):
                if wanted(rel, self.include, self.exclude):
                    out.files[rel] = seen
        except OSError as exc:
            out.error = f"{type(exc).__name__}: {exc}"
        return out

    def _walk(self, root: Path, rel: str) -> Iterator[tuple[str, Seen]]:
        with os.scandir(root / rel if rel else root) as it:
            items = sorted(it, key=lambda e: e.name)
        for entry in items:
            path = f"{rel}/{entry.name}" if rel else entry.name
            if entry.name.startswith("."):
                continue
            if entry.is_dir(follow_symlinks=False):
                yield from self._walk(root, path)
            elif entry.is_symlink():
                try:
                    target = Path(entry.path).resolve(strict=True)
                    if target.is_relative_to(root) and target.is_file():
                        st = target.stat()
                        yield path, Seen(st.st_size, st.st_mtime_ns)
                except (OSError, RuntimeError) as exc:  # a loop, or a link to nothing
                    log.warning("source %s: skipped the link %s (%s)", root, path, exc)
            elif entry.is_file(follow_symlinks=False):
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:  # removed while listed
                    continue
                yield path, Seen(st.st_size, st.st_mtime_ns)

    def read(self, rel: str, *, max_bytes: int) -> tuple[bytes, Seen]:
        """The file's bytes and the size and time they had: read again when the file changed
        while it was read, so the bytes hashed and indexed are the file's last ones."""
        root = Path(self.location).resolve()
        try:
            for _ in range(5):
                fd = open_inside(root, rel)
                try:
                    before = _fd_seen(fd)
                    if before.size > max_bytes:
                        raise SourceUnreadable(f"{rel} is larger than the upload limit")
                    faults.hit("source_before_read", path=rel)
                    with os.fdopen(os.dup(fd), "rb") as fh:
                        data = fh.read(max_bytes + 1)
                    after = _fd_seen(fd)
                finally:
                    os.close(fd)
                if after == before and len(data) == after.size:
                    return data, after
            raise SourceUnreadable(f"{rel} kept changing while it was read")
        except SourceUnreadable:
            raise
        except OSError as exc:
            raise SourceUnreadable(f"{rel}: {type(exc).__name__}: {exc.strerror or exc}") from exc


def open_inside(root: Path, rel: str) -> int:
    """A descriptor of the regular file ``rel`` names inside ``root``, opened one path part at a
    time from a handle on ``root`` without following any link; a link to a file inside ``root`` is
    followed the same way (at most ``LINK_HOPS``), any other one refused."""
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    for _ in range(LINK_HOPS):
        if not parts or ".." in parts:
            raise SourceUnreadable(f"{rel} leads out of {root}")
        dir_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            for i, part in enumerate(parts[:-1]):
                try:
                    step = os.open(
                        part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd
                    )
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                        raise SourceUnreadable(
                            f"{rel}: {'/'.join(parts[: i + 1])} is a link"
                        ) from exc
                    raise
                os.close(dir_fd)
                dir_fd = step
            try:
                fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
            except OSError as exc:
                if exc.errno != errno.ELOOP:
                    raise
                target = os.readlink(parts[-1], dir_fd=dir_fd)
                parts = _inside(root, parts[:-1], target, rel)
                continue
        finally:
            os.close(dir_fd)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise SourceUnreadable(f"{rel} is not a regular file")
        return fd
    raise SourceUnreadable(f"{rel}: more than {LINK_HOPS} links (a loop?)")


def _inside(root: Path, folder: list[str], target: str, rel: str) -> list[str]:
    """The parts, from ``root``, of a link's target (read from the link itself), or a refusal
    when it points out of ``root``."""
    if os.path.isabs(target):
        absolute = os.path.normpath(target)
    else:
        absolute = os.path.normpath(os.path.join(root, *folder, target))
    if not Path(absolute).is_relative_to(root):
        raise SourceUnreadable(f"{rel} leads out of {root}")
    return [p for p in Path(absolute).relative_to(root).parts]


def _fd_seen(fd: int) -> Seen:
    st = os.fstat(fd)
    return Seen(st.st_size, st.st_mtime_ns)


class S3Reader(SourceReader):
    """An S3 prefix, through the object store settings' endpoint and the usual AWS credentials."""

    def __init__(
        self, location: str, include: list[str], exclude: list[str], settings: Settings
    ) -> None:
        super().__init__(location, include, exclude)
        self.bucket, self.prefix = parse_s3(location)
        self.settings = settings
        self._client: Any = None

    def client(self) -> Any:
        if self._client is None:
            import boto3
            from botocore.config import Config

            s = self.settings
            config = Config(
                connect_timeout=5,
                read_timeout=60,
                retries={"total_max_attempts": 3, "mode": "standard"},
                s3={"addressing_style": "path" if s.s3_endpoint_url else "auto"},
            )
            self._client = boto3.session.Session().client(
                "s3",
                endpoint_url=s.s3_endpoint_url or None,
                region_name=s.s3_region,
                config=config,
            )
        return self._client

    def listing(self) -> Listing:
        out = Listing()
        try:
            pages = self.client().get_paginator("list_objects_v2")
            for page in pages.paginate(Bucket=self.bucket, Prefix=self.prefix):
                for obj in page.get("Contents", []):
                    rel = obj["Key"][len(self.prefix) :].lstrip("/")
                    if not rel or rel.endswith("/") or not wanted(rel, self.include, self.exclude):
                        continue
                    out.files[rel] = Seen(
                        int(obj["Size"]), _ns(obj["LastModified"]), obj.get("ETag", "")
                    )
        except Exception as exc:  # any failure of the listing: it is incomplete
            out.error = s3_failure(exc)
            log.warning(
                "S3 source %s: listing failed: %s: %s", self.location, type(exc).__name__, exc
            )
        return out

    def read(self, rel: str, *, max_bytes: int) -> tuple[bytes, Seen]:
        try:
            faults.hit("source_before_read", path=rel)
            got = self.client().get_object(Bucket=self.bucket, Key=self.prefix + rel)
            size = int(got["ContentLength"])
            if size > max_bytes:
                raise SourceUnreadable(f"{rel} is larger than the upload limit")
            body = got["Body"].read()
            return body, Seen(size, _ns(got["LastModified"]), got.get("ETag", ""))
        except SourceUnreadable:
            raise
        except Exception as exc:
            log.warning(
                "S3 source %s: %s unreadable: %s: %s", self.location, rel, type(exc).__name__, exc
            )
            raise SourceUnreadable(f"{rel}: {s3_failure(exc)}") from exc


def s3_failure(exc: BaseException) -> str:
    """What an S3 failure may say to whoever asked: its error code (``AccessDenied``,
    ``NoSuchBucket``) or its class, never botocore's text (it names hosts and ARNs; the log has
    it)."""
    code = (
        getattr(exc, "response", {}).get("Error", {}).get("Code")
        if hasattr(exc, "response")
        else None
    )
    return f"S3 refused: {code}" if code else f"S3 unreachable: {type(exc).__name__}"


def _ns(when: datetime) -> int:
    return int(when.timestamp() * 1_000_000) * 1000


def reader_for(kind: str, location: str, include: list[str], exclude: list[str], s: Settings):
    if kind == "s3":
        return S3Reader(location, include, exclude, s)
    return SourceReader(location, include, exclude)
