"""A source's plan as its sync and its preview both make it (``plan_source``), and what a preview
shows of it: its counts, and its cost in chunks to embed in the words of the dataset-settings
preview (``sluice.ops.preview.Preview``).

The preview reads the files a sync would read (to know their sha256: a rename costs nothing, a
touched file nothing) and parses a sample of those it would upload, in a child process with the
workers' limits, to count their chunks and ask the embedding cache about them.
"""

from __future__ import annotations

import logging
import tempfile
import time
from pathlib import Path

from sqlmodel import Session

from sluice import faults
from sluice.errors import PipelineError
from sluice.ops.preview import BUDGET_SECONDS, SAMPLE, Preview, file_texts
from sluice.ops.sources.listing import reader_for
from sluice.ops.sources.plan import ADD, CHANGE, CarryOut, Known, Plan, Step, SyncResult, make_plan
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


def plan_source(
    ctx: Context,
    src: Source,
    *,
    confirm: bool,
    carry_out: CarryOut | None = None,
    into: Plan | None = None,
) -> Plan:
    """List the source and make its sync's plan (``make_plan``), each step handed to
    ``carry_out`` as it is planned: the sync and its preview run this same function."""
    reader = reader_for(src.kind, src.location, src.include, src.exclude, ctx.settings)
    listing = reader.listing()
    faults.hit("source_listed", source=src.name)
    with Session(ctx.engine) as session:
        known = known_entries(session, src.id)
    max_bytes = ctx.settings.max_upload_bytes
    return make_plan(
        listing.files,
        known,
        lambda path: reader.read(path, max_bytes=max_bytes),
        error=listing.error,
        max_fraction=ctx.settings.sync_max_remove_fraction,
        confirmed=confirm,
        carry_out=carry_out,
        into=into,
    )


def preview_sync(ctx: Context, src: Source, ds: Dataset, *, confirm: bool = False) -> SyncResult:
    """What a sync of ``src`` would do and cost, doing nothing."""
    uploads: dict[str, bytes] = {}

    def keep_uploads(step: Step, data: bytes) -> None:
        if step.action in (ADD, CHANGE):
            uploads[step.path] = data

    plan = plan_source(ctx, src, confirm=confirm, carry_out=keep_uploads)
    cost = estimate(ctx, ds, uploads)
    return SyncResult(
        src.name,
        False,
        preview=True,
        status="preview",
        counts=plan.counts(),
        failed=plan.failed,
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
            p.cached += ctx.cache.contains_many(texts, dataset_id=ds.id)
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
