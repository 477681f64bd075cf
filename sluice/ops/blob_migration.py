"""``sluice blobs migrate --to s3``: move a local blob store into the object store.

Each blob is sent under its key, checked (the bytes sent must hash to the key, the object's size
must be the file's), and only then removed from the local directory. A blob the object store
already holds at the right size is not sent again, so a run that was killed is simply run again:
it goes on where it stopped, and a finished one changes nothing.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field

from sluice import faults
from sluice.errors import SettingsError
from sluice.ops.access import Operator, require_operator
from sluice.pipeline.running.context import Context
from sluice.storage.blobs import LocalBlobStore, Swept
from sluice.storage.s3_blobs import S3BlobStore

log = logging.getLogger(__name__)


@dataclass
class MigrationResult:
    source: str
    target: str
    copied: int = 0  # sent now
    already_there: int = 0  # the object store had it (an earlier run, or another upload)
    removed_local: int = 0
    bytes_sent: int = 0
    failed: list[str] = field(default_factory=list)  # "key: why"

    def to_dict(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        text = (
            f"blobs from {self.source} to {self.target}: {self.copied} sent "
            f"({self.bytes_sent:,} bytes), {self.already_there} already there, "
            f"{self.removed_local} removed from the local directory"
        )
        if self.failed:
            text += f"; {len(self.failed)} not moved: " + "; ".join(self.failed[:5])
        return text


def migrate_to_s3(ctx: Context, who: Operator, *, keep_local: bool = False) -> MigrationResult:
    """Move every blob of $SLUICE_DATA_DIR/blobs into the object store of the SLUICE_S3_
    settings (kept locally too with ``keep_local``). Idempotent and resumable."""
    require_operator(who, "move the blob store")
    s = ctx.settings
    if not s.s3_bucket:
        raise SettingsError(
            "SLUICE_S3_BUCKET is not set: name the bucket to move the blobs to (with "
            "SLUICE_S3_ENDPOINT_URL, SLUICE_S3_PREFIX and SLUICE_S3_REGION as the workers will use)"
        )
    source = LocalBlobStore(s.blob_dir)
    target = S3BlobStore.from_settings(s)
    target.ping()
    result = MigrationResult(source.describe(), target.describe())
    for key in source.keys():
        path = source.path(key)
        size = path.stat().st_size
        if target.size(key) == size:
            result.already_there += 1
        else:
            sent = target.upload_file(key, path)
            if sent != key:  # the local file is not what its name says: leave both alone
                target.delete(key)
                result.failed.append(f"{key[:12]}: the local file's sha256 is {sent[:12]}")
                continue
            result.copied += 1
            result.bytes_sent += size
        faults.hit("blob_migrated", key=key)
        if not keep_local and target.size(key) == size:
            path.unlink(missing_ok=True)
            result.removed_local += 1
    log.info("%s (by %s)", result.describe(), who.actor)
    return result


def sweep_leftovers(ctx: Context, who: Operator, *, older_than_seconds: float) -> Swept:
    """``sluice blobs sweep``: what dead uploads and removals left in the blob store, older than
    the bound (the workers' recovery does the same with a bound of a day)."""
    require_operator(who, "sweep the blob store")
    if older_than_seconds < 0:
        raise SettingsError("--older-than is a number of seconds, 0 or more")
    swept = ctx.blobs.sweep(older_than_seconds=older_than_seconds)
    log.info("%s (by %s)", swept.describe(), who.actor)
    return swept
