"""Blobs in any S3-compatible object store (boto3, the S3 API only): key = prefix + sha256.

An upload streams into a staging object under ``<prefix>tmp/`` (one PUT when it is small, a
multipart upload of PART_SIZE parts otherwise: no more than one part in memory, the size limit
counted while the bytes arrive), is copied inside the store to its key when that is not there yet,
and the staging object is the upload's second name until its document is committed. A removal
copies the blob aside under ``<prefix>tmp/`` before its last look at the blob's users. What a
process that died there leaves under ``tmp/`` is removed by ``sweep`` once older than a bound.

A store that does not answer (connection refused, timeouts, 5xx, throttling) raises
``ObjectStoreUnavailable``: an outage, for which jobs wait with attempts unspent.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

from sluice.errors import WaitingError
from sluice.files import private_dir
from sluice.settings import Settings, redact_url
from sluice.storage.blobs import (
    CHUNK,
    BlobMissing,
    BlobStore,
    BlobTooLarge,
    Readable,
    Received,
    Swept,
    is_key,
)

log = logging.getLogger(__name__)

PART_SIZE = 8 * 1024 * 1024  # S3 wants parts of at least 5 MiB but the last
T = TypeVar("T")
OUTAGE_CODES = {"SlowDown", "ServiceUnavailable", "InternalError", "RequestTimeout", "503", "500"}
AUTH_CODES = {"InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "403"}
MISSING_CODES = {"NoSuchKey", "404", "NotFound"}
STORE_HINT = (
    "Sluice waits and goes on by itself once the object store answers; check the store, "
    "SLUICE_S3_ENDPOINT_URL and SLUICE_S3_BUCKET."
)
AUTH_HINT = (
    "Check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY of the workers and consoles (and the "
    "bucket's policy); Sluice goes on by itself once the store accepts them."
)


class ObjectStoreUnavailable(WaitingError):
    """The object store does not answer, or refuses Sluice's credentials: not the job's failure."""


class S3BlobStore(BlobStore):
    kind = "s3"

    def __init__(
        self,
        *,
        bucket: str,
        prefix: str = "",
        endpoint_url: str = "",
        region: str = "us-east-1",
        scratch: Path,
        part_size: int = PART_SIZE,
        timeout: float | None = None,
    ) -> None:
        self.bucket, self.prefix, self.endpoint_url = bucket, prefix, endpoint_url
        self.region, self.scratch, self.part_size = region, Path(scratch), part_size
        self.timeout = timeout  # a probe's: that short, and no retry
        self._swept = False
        self._client: Any = None
        self._lock = threading.Lock()

    @classmethod
    def from_settings(cls, s: Settings, *, timeout: float | None = None) -> S3BlobStore:
        return cls(
            bucket=s.s3_bucket,
            prefix=s.s3_prefix,
            endpoint_url=s.s3_endpoint_url,
            region=s.s3_region,
            scratch=s.data_dir / "blob-scratch",
            timeout=timeout,
        )

    def describe(self) -> str:
        where = redact_url(self.endpoint_url) if self.endpoint_url else "AWS S3"
        return f"s3://{self.bucket}/{self.prefix} at {where}"

    @property
    def waiting_for(self) -> str:
        return f"the object store ({self.describe()})"

    # --- the client and its errors -------------------------------------------------------------

    @property
    def client(self) -> Any:
        with self._lock:
            if self._client is None:
                self._client = _make_client(self.endpoint_url, self.region, self.timeout)
            return self._client

    def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """One request; an outage of the store becomes ObjectStoreUnavailable, a missing object
        BlobMissing."""
        from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError
        from s3transfer.exceptions import RetriesExceededError

        try:
            return fn(*args, **kwargs)
        except NoCredentialsError as exc:
            raise self._auth_error(exc) from exc
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
            if code in MISSING_CODES:
                raise BlobMissing(code) from exc
            if code in AUTH_CODES:
                raise self._auth_error(exc) from exc
            if code in OUTAGE_CODES or status >= 500 or code == "NoSuchBucket":
                raise self._outage(exc) from exc
            raise
        except (BotoCoreError, RetriesExceededError) as exc:  # refused, reset, timeouts
            raise self._outage(exc) from exc

    def _outage(self, exc: BaseException) -> ObjectStoreUnavailable:
        return ObjectStoreUnavailable(
            "blob_store_unavailable",
            f"the object store does not answer: {type(exc).__name__}: {str(exc)[:200]}",
            STORE_HINT,
            waiting_for=self.waiting_for,
        )

    def _auth_error(self, exc: BaseException) -> ObjectStoreUnavailable:
        return ObjectStoreUnavailable(
            "blob_store_auth_failed",
            f"the object store refused Sluice's credentials: {type(exc).__name__}",
            AUTH_HINT,
            waiting_for=f"credentials that {self.waiting_for} accepts",
        )

    def object_key(self, key: str) -> str:
        if not is_key(key):
            raise ValueError(f"not a blob key: {key!r}")
        return self.prefix + key

    def _tmp_key(self, kind: str) -> str:
        """A name under tmp/ that says when it was made (milliseconds), for ``sweep``: not every
        S3-compatible store reports a multipart upload's true start."""
        return f"{self.prefix}tmp/{kind}-{time.time_ns() // 1_000_000}-{uuid.uuid4().hex}"

    def _head(self, name: str) -> int | None:
        """The object's size, or None when there is none."""
        try:
            meta = self._call(self.client.head_object, Bucket=self.bucket, Key=name)
        except BlobMissing:
            return None
        return int(meta["ContentLength"])

    def _copy(self, source: str, target: str) -> None:
        self._call(
            self.client.copy,
            {"Bucket": self.bucket, "Key": source},
            self.bucket,
            target,
        )

    def _remove(self, name: str) -> None:
        self._call(self.client.delete_object, Bucket=self.bucket, Key=name)

    def ping(self) -> str:
        """Raise ObjectStoreUnavailable unless the bucket answers; a short description if so."""
        self._call(self.client.head_bucket, Bucket=self.bucket)
        return f"bucket {self.bucket} answers"

    # --- the interface -------------------------------------------------------------------------

    def exists(self, key: str) -> bool:
        return self._head(self.object_key(key)) is not None

    def size(self, key: str) -> int | None:
        return self._head(self.object_key(key))

    def receive(self, stream: Readable, *, max_bytes: int) -> Received:
        staging = self._tmp_key("upload")
        counter = _Counter(stream, max_bytes)
        first = counter.read_part(self.part_size)
        if len(first) < self.part_size:
            self._call(self.client.put_object, Bucket=self.bucket, Key=staging, Body=bytes(first))
        else:
            self._multipart(staging, first, counter)
        key = counter.digest.hexdigest()
        try:
            if self._head(self.object_key(key)) is None:
                self._copy(staging, self.object_key(key))
        except BaseException:
            self._quietly(self._remove, staging)
            raise
        return Received(key, counter.size, staging)

    def _multipart(self, name: str, first: bytearray, counter: _Counter) -> None:
        upload = self._call(self.client.create_multipart_upload, Bucket=self.bucket, Key=name)
        uid = upload["UploadId"]
        parts: list[dict[str, Any]] = []
        part = first
        try:
            while part:
                got = self._call(
                    self.client.upload_part,
                    Bucket=self.bucket,
                    Key=name,
                    UploadId=uid,
                    PartNumber=len(parts) + 1,
                    Body=bytes(part),
                )
                parts.append({"ETag": got["ETag"], "PartNumber": len(parts) + 1})
                part = counter.read_part(self.part_size)
            self._call(
                self.client.complete_multipart_upload,
                Bucket=self.bucket,
                Key=name,
                UploadId=uid,
                MultipartUpload={"Parts": parts},
            )
        except BaseException:
            self._quietly(
                self.client.abort_multipart_upload, Bucket=self.bucket, Key=name, UploadId=uid
            )
            raise

    def _quietly(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """Clean up after a failure; a store that does not answer leaves a staging object."""
        try:
            self._call(fn, *args, **kwargs)
        except Exception as exc:
            log.warning("object store: could not clean up (%s); a tmp/ object is left", exc)

    def keep(self, key: str, held: object) -> None:
        assert isinstance(held, str)
        if self._head(self.object_key(key)) is None:  # a removal took it meanwhile
            self._copy(held, self.object_key(key))
        self._remove(held)

    def release(self, held: object) -> None:
        assert isinstance(held, str)
        self._quietly(self._remove, held)

    def delete(self, key: str) -> bool:
        if self._head(self.object_key(key)) is None:
            return False
        self._remove(self.object_key(key))
        return True

    def retire(self, key: str) -> str | None:
        aside = self._tmp_key(f"retired-{key}")
        try:
            self._copy(self.object_key(key), aside)
        except BlobMissing:
            return None
        self._remove(self.object_key(key))
        return aside

    def unretire(self, key: str, aside: object) -> None:
        assert isinstance(aside, str)
        self._copy(aside, self.object_key(key))
        self._remove(aside)

    def drop(self, aside: object) -> None:
        assert isinstance(aside, str)
        self._remove(aside)

    def keys(self) -> Iterator[str]:
        """Every blob key in the store (staging and retired objects under tmp/ excluded)."""
        paginator = self.client.get_paginator("list_objects_v2")
        pages = self._call(
            lambda: list(paginator.paginate(Bucket=self.bucket, Prefix=self.prefix, Delimiter="/"))
        )
        for page in pages:
            for item in page.get("Contents", ()):
                name = item["Key"][len(self.prefix) :]
                if is_key(name):
                    yield name

    def sweep(self, *, older_than_seconds: float) -> Swept:
        """Leftovers under ``<prefix>tmp/`` older than the bound: the staging objects of uploads
        that died before their document was committed (or their cleanup found the store down),
        unfinished multipart uploads (aborted), and blobs a removal that died had moved aside
        (put back under their key when that has no object, then removed: a sweep never loses
        bytes a document may still name). Younger ones are left: their upload may be running."""
        cutoff = time.time() - older_than_seconds
        swept = Swept(self.describe())
        tmp = f"{self.prefix}tmp/"
        paginator = self.client.get_paginator("list_objects_v2")
        pages = self._call(lambda: list(paginator.paginate(Bucket=self.bucket, Prefix=tmp)))
        for item in (i for page in pages for i in page.get("Contents", ())):
            name = item["Key"]
            if _made(name, item["LastModified"].timestamp()) >= cutoff:
                swept.kept_young += 1
            elif name.startswith(f"{tmp}upload-"):
                self._remove(name)
                swept.staged += 1
            elif name.startswith(f"{tmp}retired-"):
                key = name[len(f"{tmp}retired-") :].split("-")[0]
                if is_key(key) and self._head(self.object_key(key)) is None:
                    self._copy(name, self.object_key(key))
                    swept.restored += 1
                self._remove(name)
                swept.retired += 1
        listed = self._call(self.client.list_multipart_uploads, Bucket=self.bucket, Prefix=tmp)
        for upload in listed.get("Uploads", ()):
            if _made(upload["Key"], upload["Initiated"].timestamp()) >= cutoff:
                swept.kept_young += 1
                continue
            self._call(
                self.client.abort_multipart_upload,
                Bucket=self.bucket,
                Key=upload["Key"],
                UploadId=upload["UploadId"],
            )
            swept.multipart += 1
        return swept

    @contextmanager
    def local_copy(self, key: str) -> Iterator[Path]:
        """The blob streamed to a private scratch file of this host (never whole in memory),
        removed when the block ends."""
        self._sweep()
        fd, tmp = tempfile.mkstemp(dir=self.scratch, prefix=f"fetch-{os.getpid()}-")
        try:
            with os.fdopen(fd, "wb") as out:
                self._call(self.client.download_fileobj, self.bucket, self.object_key(key), out)
            yield Path(tmp)
        finally:
            Path(tmp).unlink(missing_ok=True)

    def _sweep(self) -> None:
        """Once per process: remove the scratch copies of processes that died holding one (a
        worker killed in the middle of a job leaves its copy; the next worker of the host
        removes it)."""
        private_dir(self.scratch)
        if self._swept:
            return
        self._swept = True
        for path in self.scratch.glob("fetch-*"):
            pid = path.name.split("-")[1]
            if pid.isdigit() and not _alive(int(pid)):
                path.unlink(missing_ok=True)

    def upload_file(self, key: str, path: Path) -> str:
        """Put a local file under ``key`` (multipart when large); the sha256 of what was sent."""
        digest = hashlib.sha256()
        with open(path, "rb") as fh:
            reader = _Hashing(fh, digest)
            self._call(self.client.upload_fileobj, reader, self.bucket, self.object_key(key))
        return digest.hexdigest()


def _made(name: str, stored: float) -> float:
    """When a tmp/ object was made: the later of the time in its name and the store's own."""
    stamps = [p for p in name.rsplit("/", 1)[-1].split("-") if p.isdigit() and len(p) == 13]
    return max([stored] + [int(p) / 1000 for p in stamps[-1:]])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class _Counter:
    """Reads a stream in parts, hashing and counting; BlobTooLarge past the limit."""

    def __init__(self, stream: Readable, max_bytes: int) -> None:
        self.stream, self.max_bytes = stream, max_bytes
        self.digest = hashlib.sha256()
        self.size = 0

    def read_part(self, part_size: int) -> bytearray:
        part = bytearray()
        while len(part) < part_size:
            block = self.stream.read(min(CHUNK, part_size - len(part)))
            if not block:
                break
            self.size += len(block)
            if self.size > self.max_bytes:
                raise BlobTooLarge(self.max_bytes, self.size)
            self.digest.update(block)
            part += block
        return part


class _Hashing:
    def __init__(self, fh: BinaryIO, digest: Any) -> None:
        self.fh, self.digest = fh, digest

    def read(self, n: int = -1) -> bytes:
        data = self.fh.read(n)
        self.digest.update(data)
        return data


def _make_client(endpoint_url: str, region: str, timeout: float | None = None) -> Any:
    """A boto3 S3 client: bounded timeouts and retries, path-style addressing for a store of
    one's own, checksums only where the API requires them (not every S3-compatible store has
    the newer ones). Credentials from the environment (AWS_ACCESS_KEY_ID, ...)."""
    import boto3
    from botocore.config import Config

    config = Config(
        connect_timeout=timeout or 5,
        read_timeout=timeout or 60,
        retries={"total_max_attempts": 1 if timeout else 3, "mode": "standard"},
        s3={"addressing_style": "path" if endpoint_url else "auto"},
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
    )
    return boto3.session.Session().client(
        "s3", endpoint_url=endpoint_url or None, region_name=region, config=config
    )
