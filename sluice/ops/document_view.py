"""One document as an operator inspects it: metadata, jobs and versions, the chunks search serves
(in order, with pages), a source page rendered as an image with a chunk located on it, and the
original bytes (operators only: a read-only user sees everything but takes no copy of the file).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from dataclasses import asdict, dataclass, field

from sqlmodel import Session

from sluice.errors import PipelineError
from sluice.ops.access import Operator, require_operator
from sluice.ops.documents import DocumentInfo, UnknownReference, document_info, resolve
from sluice.pipeline.parsing.parse import PageImage, ParseLimits, render_pdf_page
from sluice.pipeline.running.context import Context
from sluice.storage import lexical
from sluice.storage.blobs import BlobMissing
from sluice.storage.db import stored
from sluice.storage.models import Dataset, Document, Job

log = logging.getLogger(__name__)

PDF = "application/pdf"
CHUNKS_PER_PAGE = 20


@dataclass
class DocumentView:
    info: DocumentInfo
    media_type: str
    created_at: str
    chunk_count: int  # chunks of the active job, switched off ones too
    page_count: int | None
    metadata: dict = field(default_factory=dict)  # the application's fields (sluice.ops.metadata)
    disabled_count: int = 0  # of those, switched off: kept, but no search answers them
    # The whole document switched off (sluice.ops.document_switch): no search answers any chunk.
    enabled: bool = True
    disabled_at: str | None = None
    disabled_by: str | None = None

    @property
    def served_count(self) -> int:
        """The chunks search answers from: the active job's, less those switched off (none of a
        document switched off)."""
        return self.chunk_count - self.disabled_count if self.enabled else 0

    def to_dict(self) -> dict:
        return {
            **asdict(self.info),
            "media_type": self.media_type,
            "created_at": self.created_at,
            "chunk_count": self.chunk_count,
            "page_count": self.page_count,
            "metadata": dict(self.metadata),
            "enabled": self.enabled,
            "disabled_at": self.disabled_at,
            "disabled_by": self.disabled_by,
        }


def view(ctx: Context, ref: str | int) -> DocumentView:
    """The document a job id or ``doc:ID`` names (UnknownReference if none)."""
    document_id = resolve(ctx, ref)
    info = document_info(ctx, document_id)
    with Session(ctx.engine) as session:
        doc = stored(session, Document, document_id)
        active = session.get(Job, doc.active_job_id) if doc.active_job_id else None
    return DocumentView(
        info,
        doc.media_type,
        doc.created_at.isoformat(timespec="seconds"),
        active.chunk_count or 0 if active else 0,
        active.page_count if active else None,
        dict(doc.metadata_ or {}),
        lexical.count_job_disabled(ctx.engine, active.id) if active and active.id else 0,
        doc.disabled_at is None,
        doc.disabled_at.isoformat(timespec="seconds") if doc.disabled_at else None,
        doc.disabled_by,
    )


def chunks(
    ctx: Context, document_id: int, *, offset: int = 0, limit: int = CHUNKS_PER_PAGE
) -> list[lexical.ChunkRow]:
    """One page of the chunks search serves for the document, in order (none when nothing is
    served)."""
    with Session(ctx.engine) as session:
        doc = session.get(Document, document_id)
    if doc is None:
        raise UnknownReference(f"no document {document_id}")
    if doc.active_job_id is None or doc.deleted_at is not None:
        return []
    return lexical.job_chunks(ctx.engine, doc.active_job_id, offset=offset, limit=limit)


def positions(ctx: Context, document_id: int, chunk_ids: list[str]) -> dict[str, tuple[str, bool]]:
    """chunk id -> where in its file it sits ("section 2: Findings", "slide 3"; "" for a page of
    a PDF or text) and whether OCR read it: what search tells of a hit, kept with the vectors (one
    read of these few chunks; {} when the store does not answer, the page numbers stand)."""
    with Session(ctx.engine) as session:
        doc = session.get(Document, document_id)
        ds = session.get(Dataset, doc.dataset_id) if doc is not None else None
    if ds is None or not chunk_ids:
        return {}
    try:
        got = ctx.vectors.get(ds.collection, chunk_ids)
    except Exception as exc:
        log.warning("document view: positions of %d chunk(s) unavailable: %s", len(chunk_ids), exc)
        return {}
    found = zip(got.get("ids") or [], got.get("metadatas") or [], strict=False)
    return {cid: (str(m.get("where", "")), bool(m.get("ocr", False))) for cid, m in found if m}


PageNotDrawn = PipelineError  # what page_image raises for a page it cannot draw (message, hint)
MAX_PIXELS = 16_000_000  # a page image is never larger (a 1 KB PDF can declare a 200-inch page)
RENDER_SECONDS = 20.0  # a page that takes longer to draw is not drawn
CACHE_ENTRIES = 32
CACHE_MAX_BYTES = 8 * 1024 * 1024  # larger images are drawn again rather than kept
_cache: OrderedDict[tuple, PageImage | PipelineError | None] = OrderedDict()
_cache_lock = threading.Lock()


def page_image(
    ctx: Context, document_id: int, page: int, *, locate: str | None = None, zoom: float = 1.5
) -> PageImage | None:
    """A PDF page as a PNG with ``locate``'s first words highlighted (``PageImage``), or None for
    a document that is not a PDF, a page it does not have, or a file that is gone.

    The page is drawn in a child process with the extraction limits (memory, CPU), a deadline and
    a pixel cap, never in the console's process: a hostile PDF costs the child, not every user's
    console. What was drawn (or why it could not be) is kept for the next run of the page; a page
    that cannot be drawn raises a PipelineError whose message says why."""
    with Session(ctx.engine) as session:
        doc = session.get(Document, document_id)
    if doc is None or doc.media_type != PDF:
        return None
    key = (doc.sha256, page, locate, zoom)
    with _cache_lock:
        if key in _cache:
            _cache.move_to_end(key)
            kept = _cache[key]
            if isinstance(kept, PipelineError):
                raise kept
            return kept
    try:
        with ctx.blobs.local_copy(doc.blob_key) as path:
            drawn: PageImage | PipelineError | None = render_pdf_page(
                path,
                page,
                locate=locate,
                zoom=zoom,
                max_pixels=MAX_PIXELS,
                seconds=RENDER_SECONDS,
                limits=ParseLimits.from_settings(ctx.settings),
                name=doc.filename,
            )
    except BlobMissing:
        return None
    except PipelineError as exc:
        drawn = exc
    _keep(key, drawn)
    if isinstance(drawn, PipelineError):
        raise drawn
    return drawn


def _keep(key: tuple, drawn: PageImage | PipelineError | None) -> None:
    if isinstance(drawn, PageImage) and len(drawn.png) > CACHE_MAX_BYTES:
        return
    with _cache_lock:
        _cache[key] = drawn
        while len(_cache) > CACHE_ENTRIES:
            _cache.popitem(last=False)


def original(ctx: Context, who: Operator, document_id: int) -> tuple[bytes, str, str]:
    """(bytes, file name, media type) of the uploaded file: operators only."""
    require_operator(who, "download documents")
    with Session(ctx.engine) as session:
        doc = session.get(Document, document_id)
    if doc is None:
        raise UnknownReference(f"no document {document_id}")
    return ctx.blobs.read(doc.blob_key), doc.filename, doc.media_type


def job_chunks(
    ctx: Context, job_id: int, *, offset: int = 0, limit: int = 10_000
) -> list[lexical.ChunkRow]:
    """A job's chunks in order, as its index holds them (``sluice show --chunks``)."""
    return lexical.job_chunks(ctx.engine, job_id, offset=offset, limit=limit)
