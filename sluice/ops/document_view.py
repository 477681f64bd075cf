"""One document as an operator inspects it: metadata, jobs and versions, the chunks search serves (in
order, with pages), a source page rendered as an image with a chunk located on it, and the original
bytes (operators only: a read-only user sees everything but takes no copy of the file).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from sqlmodel import Session

from sluice.ops.access import Operator, require_operator
from sluice.ops.documents import DocumentInfo, UnknownReference, document_info, resolve
from sluice.pipeline.running.context import Context
from sluice.storage import lexical
from sluice.storage.blobs import BlobMissing
from sluice.storage.models import Document, Job

PDF = "application/pdf"
CHUNKS_PER_PAGE = 20
LOCATE_WORDS = 8  # the first words of a chunk, searched for on its page


@dataclass
class DocumentView:
    info: DocumentInfo
    media_type: str
    created_at: str
    chunk_count: int  # chunks of the active job (what search serves)
    page_count: int | None

    def to_dict(self) -> dict:
        return {
            **asdict(self.info),
            "media_type": self.media_type,
            "created_at": self.created_at,
            "chunk_count": self.chunk_count,
            "page_count": self.page_count,
        }


def view(ctx: Context, ref: str | int) -> DocumentView:
    """The document a job id or ``doc:ID`` names (UnknownReference if none)."""
    document_id = resolve(ctx, ref)
    info = document_info(ctx, document_id)
    with Session(ctx.engine) as session:
        doc = session.get(Document, document_id)
        active = session.get(Job, doc.active_job_id) if doc.active_job_id else None
    return DocumentView(
        info,
        doc.media_type,
        doc.created_at.isoformat(timespec="seconds"),
        active.chunk_count or 0 if active else 0,
        active.page_count if active else None,
    )


def chunks(
    ctx: Context, document_id: int, *, offset: int = 0, limit: int = CHUNKS_PER_PAGE
) -> list[lexical.ChunkRow]:
    """One page of the chunks search serves for the document, in order (none when nothing is served)."""
    with Session(ctx.engine) as session:
        doc = session.get(Document, document_id)
    if doc is None:
        raise UnknownReference(f"no document {document_id}")
    if doc.active_job_id is None or doc.deleted_at is not None:
        return []
    return lexical.job_chunks(ctx.engine, doc.active_job_id, offset=offset, limit=limit)


def page_image(
    ctx: Context, document_id: int, page: int, *, locate: str | None = None, zoom: float = 1.5
) -> tuple[bytes, int] | None:
    """(PNG of a PDF page, rectangles where ``locate``'s first words were found on it), or None for a
    document that is not a PDF or whose file is gone."""
    import pymupdf

    with Session(ctx.engine) as session:
        doc = session.get(Document, document_id)
    if doc is None or doc.media_type != PDF:
        return None
    try:
        with ctx.blobs.local_copy(doc.blob_key) as path:
            return _render(pymupdf, path, page, locate, zoom)
    except BlobMissing:
        return None


def _render(
    pymupdf, path: Path, page: int, locate: str | None, zoom: float
) -> tuple[bytes, int] | None:
    with pymupdf.open(path) as pdf:
        if pdf.needs_pass or not 1 <= page <= pdf.page_count:
            return None
        p = pdf[page - 1]
        found = 0
        if locate:
            words = " ".join(locate.split()[:LOCATE_WORDS])
            rects = p.search_for(words) if words else []
            for r in rects:
                p.add_highlight_annot(r)
            found = len(rects)
        return p.get_pixmap(matrix=pymupdf.Matrix(zoom, zoom), annots=True).tobytes("png"), found


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
