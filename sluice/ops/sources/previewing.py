"""What a sync would do, without doing it: the plan with its counts, and its cost in chunks to
embed in the words of the dataset-settings preview (``sluice.ops.preview.Preview``).

The preview reads the files a sync would read (to know their sha256: a rename costs nothing, a
touched file nothing) and parses a sample of those it would upload, in a child process with the
workers' limits, to count their chunks and ask the embedding cache about them.
"""

from __future__ import annotations

import hashlib
import logging
import tempfile
import time
from pathlib import Path

from sqlmodel import Session

from sluice.errors import PipelineError
from sluice.ops.preview import BUDGET_SECONDS, SAMPLE, Preview, file_texts
from sluice.ops.sources.listing import reader_for
from sluice.ops.sources.plan import Known, SyncResult, make_plan, to_read
from sluice.pipeline.parsing.parse import sniff_type
from sluice.pipeline.running.context import Context
from sluice.storage import source_records as records
from sluice.storage.models import Dataset
from sluice.storage.source_records import Source

log = logging.getLogger(__name__)


def known_entries(session: Session, source_id: int) -> dict[str, Known]:
    """What the source's syncs recorded, by path (tombstones included)."""
    return {
        r.path: Known(
            r.path,
            r.size,
            r.mtime_ns,
            r.sha256,
            r.document_id,
            r.removed_at is not None,
            r.etag or "",
        )
        for r in records.entries(session, source_id)
    }


def preview_sync(ctx: Context, src: Source, ds: Dataset, *, confirm: bool = False):
    reader = reader_for(src.kind, src.location, src.include, src.exclude, ctx.settings)
    listing = reader.listing()
    with Session(ctx.engine) as session:
        known = known_entries(session, src.id)
    hashes: dict[str, str] = {}
    blobs: dict[str, bytes] = {}
    failed = []
    for path in to_read(listing.files, known):
        try:
            data, _ = reader.read(path, max_bytes=ctx.settings.max_upload_bytes)
        except OSError as exc:
            failed.append({"path": path, "error": str(exc)})
            continue
        hashes[path] = hashlib.sha256(data).hexdigest()
        blobs[path] = data
    plan = make_plan(
        listing.files,
        known,
        hashes,
        error=listing.error,
        max_fraction=ctx.settings.sync_max_remove_fraction,
        confirmed=confirm,
    )
    cost = estimate(ctx, ds, {p: blobs[p] for p in plan.add + plan.change})
    counts = {**plan.counts(), "failed": len(failed)}
    return SyncResult(
        src.name,
        False,
        preview=True,
        status="preview",
        counts=counts,
        failed=failed,
        held_reason=plan.held_reason,
        cost=cost.describe(),
        to_embed=cost.to_embed,
        message=plan.describe() + f"; to upload: {cost.describe()}",
    )


def estimate(ctx: Context, ds: Dataset, files: dict[str, bytes]) -> Preview:
    """Chunks the uploads would make (a sample parsed, the rest extrapolated), the cache's share."""
    s = ctx.settings_for(ds)
    p = Preview(jobs=len(files), documents=len(files))
    started = time.monotonic()
    with tempfile.TemporaryDirectory(dir=ctx.settings.data_dir) as tmp:
        for path, data in sorted(files.items()):
            if p.sampled >= SAMPLE or time.monotonic() - started > BUDGET_SECONDS:
                break
            p.sampled += 1
            try:
                texts = _texts(Path(tmp), path, data, s)
            except (PipelineError, OSError) as exc:
                log.info("sync preview: %s cannot be read: %s", path, exc)
                p.unreadable += 1
                continue
            p.chunks += len(texts)
            p.cached += ctx.cache.contains_many(texts)
    if p.sampled and len(files) > p.sampled:
        factor = len(files) / p.sampled
        p.chunks, p.cached = round(p.chunks * factor), round(p.cached * factor)
        p.estimated = True
    p.to_embed = max(0, p.chunks - p.cached)
    return p


def _texts(tmp: Path, path: str, data: bytes, s) -> list[str]:
    name = path.rsplit("/", 1)[-1]
    media_type = sniff_type(data[:8192], name)
    local = tmp / "candidate"
    local.write_bytes(data)
    return file_texts(local, media_type=media_type, name=name, settings=s)
