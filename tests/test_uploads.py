"""Bad inputs: each one gets a clear, classified error, and nothing is stored or indexed.

Refused at upload (nothing reaches the blob store or the database): over the size limit, a type
the bytes show Sluice cannot read whatever the name says, an empty file. Refused in the worker
(the upload is kept, the job fails with a fix hint, nothing is indexed): over the page or chunk
limit, a stage over its time limit.
"""

from __future__ import annotations

import hashlib
import io
import struct
import zipfile

import pymupdf
import pytest
from sqlmodel import Session, func, select

from sluice.ops.ingest import ingest_bytes, ingest_stream, sanitize_filename
from sluice.pipeline.running.runner import run_job
from sluice.storage.blobs import CHUNK
from sluice.storage.models import Document, ErrorKind, Job, JobEvent, JobStatus, Outbox
from tests.support.helpers import collection, ids_of_job, job

WORDS = (
    "sluice gate water channel lock weir basin canal flow level river dam spill mill race"
).split()


def make_pdf(pages: int, lines_per_page: int = 3, seed: int = 0) -> bytes:
    doc = pymupdf.open()
    for p in range(pages):
        page = doc.new_page()
        for line in range(lines_per_page):
            words = " ".join(WORDS[(seed + p * 7 + line * 3 + i) % len(WORDS)] for i in range(12))
            page.insert_text(
                (40, 40 + 14 * line), f"page {p + 1} line {line + 1}: {words}", fontsize=9
            )
    data = doc.tobytes()
    doc.close()
    return data


def png_bytes() -> bytes:
    pix = pymupdf.Pixmap(pymupdf.csRGB, pymupdf.IRect(0, 0, 8, 8), False)
    return pix.tobytes("png")


def zip_bytes() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("notes.txt", "plain words inside an archive " * 50)
    return buf.getvalue()


def elf_bytes() -> bytes:
    # A 64-bit little-endian ELF header (x86-64 executable), then padding.
    header = b"\x7fELF" + bytes([2, 1, 1, 0]) + bytes(8) + struct.pack("<HHI", 2, 0x3E, 1)
    return header + bytes(4096 - len(header))


def stored(ctx) -> dict[str, int]:
    """What an upload may leave behind: files under the blob dir and rows in the job database."""
    files = (
        [p for p in ctx.settings.blob_dir.rglob("*") if p.is_file()]
        if ctx.settings.blob_dir.exists()
        else []
    )
    with Session(ctx.engine) as session:
        rows = {
            t.__name__: session.exec(select(func.count()).select_from(t)).one()
            for t in (Document, Job, Outbox, JobEvent)
        }
    return {"files": len(files), **rows}


NOTHING = {"files": 0, "Document": 0, "Job": 0, "Outbox": 0, "JobEvent": 0}


# --- refused at upload ----------------------------------------------------------------------------


BAD_TYPES = [
    # (display name, bytes, error kind, error code, words the message must contain)
    ("scan.pdf", png_bytes, "user_action_required", "unsupported_type", ["image/png", ".pdf"]),
    (
        "notes.txt",
        zip_bytes,
        "user_action_required",
        "unsupported_type",
        ["application/zip", ".txt"],
    ),
    ("report.pdf", elf_bytes, "user_action_required", "unsupported_type", ["elf"]),
    (
        "random.md",
        lambda: bytes(range(256)) * 64,
        "user_action_required",
        "unsupported_type",
        ["neither"],
    ),
    ("empty.pdf", lambda: b"", "permanent", "empty_file", ["empty"]),
]


@pytest.mark.parametrize(
    ("name", "make", "kind", "code", "words"), BAD_TYPES, ids=[f"{c[0]}:{c[3]}" for c in BAD_TYPES]
)
def test_type_comes_from_the_bytes_not_the_name(ctx, name, make, kind, code, words):
    result = ingest_bytes(ctx, make(), dataset="default", filename=name)
    assert not result.accepted
    assert (result.error_kind, result.error_code) == (kind, code)
    for word in words:
        assert word.lower() in result.message.lower(), result.message
    assert result.fix_hint
    assert stored(ctx) == NOTHING


def test_a_pdf_named_txt_is_read_as_a_pdf_and_text_named_pdf_as_text(ctx):
    pdf = ingest_bytes(ctx, make_pdf(2), dataset="default", filename="really-a-pdf.txt")
    text = ingest_bytes(
        ctx,
        b"plain words about canals and locks\n" * 40,
        dataset="default",
        filename="really-text.pdf",
    )
    with Session(ctx.engine) as session:
        types = {d.filename: d.media_type for d in session.exec(select(Document)).all()}
    assert types == {"really-a-pdf.txt": "application/pdf", "really-text.pdf": "text/plain"}
    for result in (pdf, text):
        assert run_job(result.job_id, ctx=ctx).result == "succeeded"


def test_an_upload_over_the_limit_is_refused_and_leaves_nothing(make_ctx):
    ctx = make_ctx(SLUICE_MAX_UPLOAD_BYTES=str(64 * 1024))
    data = make_pdf(1) + b"%" + b"x" * (128 * 1024)  # a valid PDF head, padded past the limit
    result = ingest_bytes(ctx, data, dataset="default", filename="big.pdf")
    assert not result.accepted
    assert (result.error_kind, result.error_code) == ("user_action_required", "too_large")
    assert "limit" in result.message and "SLUICE_MAX_UPLOAD_BYTES" in result.fix_hint
    assert stored(ctx) == NOTHING  # the temporary file is gone too


class EndlessPDF(io.RawIOBase):
    """A never-ending upload that counts what was read from it."""

    def __init__(self) -> None:
        self.read_bytes = 0

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        n = CHUNK if n is None or n < 0 else n
        block = (b"%PDF-1.7\n" if self.read_bytes == 0 else b"") + b"0" * n
        block = block[:n]
        self.read_bytes += len(block)
        return block


def test_the_size_limit_stops_reading_an_endless_stream(make_ctx):
    """The limit is checked while the bytes stream in: reading stops just past it."""
    limit = 2 * CHUNK
    ctx = make_ctx(SLUICE_MAX_UPLOAD_BYTES=str(limit))
    stream = EndlessPDF()
    result = ingest_stream(ctx, dataset="default", filename="endless.pdf", stream=stream)
    assert result.error_code == "too_large"
    assert stream.read_bytes <= limit + 2 * CHUNK
    assert stored(ctx) == NOTHING


def test_an_upload_at_the_limit_is_accepted(make_ctx):
    data = make_pdf(1)
    ctx = make_ctx(SLUICE_MAX_UPLOAD_BYTES=str(len(data)))
    assert ingest_bytes(ctx, data, dataset="default", filename="exact.pdf").accepted


# --- names ----------------------------------------------------------------------------------------


NAMES = [
    ("../../etc/passwd", "passwd"),
    ("..\\..\\windows\\system32\\boot.ini", "boot.ini"),
    ("/absolute/path/report.pdf", "report.pdf"),
    ("invoice\u202efdp.exe", "invoice fdp.exe"),  # right-to-left override shows "exe.pdf"
    ("bell\x07tab\tnul\x00esc\x1b[31mred.pdf", "bell tab nul esc [31mred.pdf"),
    ("line\nbreak\r\nname.pdf", "line break name.pdf"),
    ("zero\u200bwidth\u2066isolate\u2069.pdf", "zero width isolate .pdf"),
    ("../", "unnamed"),
    ("", "unnamed"),
    ("\u202e\u202d", "unnamed"),
    ("x" * 500 + ".pdf", "x" * 200),
]


@pytest.mark.parametrize(("raw", "shown"), NAMES, ids=[repr(r[:30]) for r, _ in NAMES])
def test_display_names_are_sanitised(raw, shown):
    assert sanitize_filename(raw) == shown


def test_the_blob_path_comes_from_the_hash_never_from_the_name(ctx):
    data = make_pdf(1, seed=3)
    result = ingest_bytes(
        ctx, data, dataset="default", filename="../../../../tmp/evil\u202efdp.exe"
    )
    assert result.accepted and result.filename == "evil fdp.exe"
    sha = hashlib.sha256(data).hexdigest()
    with Session(ctx.engine) as session:
        document = session.get(Document, result.document_id)
    assert (document.sha256, document.blob_key, document.filename) == (sha, sha, "evil fdp.exe")
    files = [p for p in ctx.settings.blob_dir.rglob("*") if p.is_file()]
    assert files == [ctx.settings.blob_dir / sha[:2] / sha[2:4] / sha]
    assert files[0].read_bytes() == data
    # Nothing was written anywhere else under the data directory besides the job database.
    others = [
        p
        for p in ctx.settings.data_dir.rglob("*")
        if p.is_file()
        and ctx.settings.blob_dir not in p.parents
        and not p.name.startswith("sluice.db")
    ]
    assert others == []


# --- refused in the worker: page, chunk and time limits -------------------------------------------


def _run_refused(ctx, data: bytes, name: str) -> Job:
    result = ingest_bytes(ctx, data, dataset="default", filename=name)
    assert result.accepted, result.message
    outcome = run_job(result.job_id, ctx=ctx)
    assert outcome.result == "failed", outcome
    return job(ctx, result.job_id)


def _nothing_indexed(ctx, job_id: int) -> None:
    assert ids_of_job(ctx, job_id) == []
    assert ctx.vectors.count(collection(ctx)) == 0


def test_a_pdf_over_the_page_limit_fails_with_a_hint_and_nothing_indexed(make_ctx):
    ctx = make_ctx(SLUICE_MAX_PAGES="5")
    failed = _run_refused(ctx, make_pdf(6), "six-pages.pdf")
    assert failed.status == JobStatus.failed
    assert (failed.error_kind, failed.error_code) == (
        ErrorKind.user_action_required,
        "too_many_pages",
    )
    assert "6 pages" in failed.error_message and "limit of 5" in failed.error_message
    assert "SLUICE_MAX_PAGES" in failed.fix_hint
    assert failed.attempt == 1  # not retried
    _nothing_indexed(ctx, failed.id)


def test_a_pdf_at_the_page_limit_is_indexed(make_ctx):
    ctx = make_ctx(SLUICE_MAX_PAGES="5")
    result = ingest_bytes(ctx, make_pdf(5), dataset="default", filename="five-pages.pdf")
    assert run_job(result.job_id, ctx=ctx).result == "succeeded"
    assert job(ctx, result.job_id).page_count == 5


def test_a_text_over_the_page_limit_fails_with_a_hint(make_ctx):
    ctx = make_ctx(SLUICE_MAX_PAGES="2")
    failed = _run_refused(
        ctx, b"words and more words about water\n" * 2500, "long.txt"
    )  # ~82,000 chars
    assert (failed.error_kind, failed.error_code) == (
        ErrorKind.user_action_required,
        "too_many_pages",
    )
    assert "SLUICE_MAX_PAGES" in failed.fix_hint
    _nothing_indexed(ctx, failed.id)


def test_a_pdf_over_the_chunk_limit_fails_with_a_hint_and_nothing_indexed(make_ctx):
    ctx = make_ctx(SLUICE_MAX_CHUNKS="3", SLUICE_CHUNK_SIZE="200", SLUICE_CHUNK_OVERLAP="0")
    failed = _run_refused(ctx, make_pdf(3, lines_per_page=40), "dense.pdf")
    assert (failed.error_kind, failed.error_code) == (
        ErrorKind.user_action_required,
        "too_many_chunks",
    )
    assert "more than 3 chunks" in failed.error_message
    assert "SLUICE_MAX_CHUNKS" in failed.fix_hint
    _nothing_indexed(ctx, failed.id)


def test_a_stage_over_its_time_limit_is_retried_then_fails_classified(make_ctx, monkeypatch):
    # A starved host makes any document slow: transient, retried while attempts last.
    # (The heartbeat's watchdog, which ends an attempt stuck in one call, beats too rarely here to
    # act first: this is the job's own thread noticing at its next batch.) Parsing starts a child
    # process (0.1 s, more on a busy machine): the limit leaves it room.
    ctx = make_ctx(
        SLUICE_STAGE_TIMEOUT_SECONDS="2",
        SLUICE_EMBED_BATCH_SIZE="2",
        SLUICE_MAX_ATTEMPTS="1",
        SLUICE_HEARTBEAT_SECONDS="30",
    )
    monkeypatch.setenv("SLUICE_FAULTS", "embed_batch=sleep:2.5")
    failed = _run_refused(ctx, make_pdf(4), "slow.pdf")
    assert (failed.error_kind, failed.error_code) == (ErrorKind.transient, "stage_timeout")
    assert failed.error_message.startswith("gave up after 1 attempts: embedding took longer than")
    assert "SLUICE_STAGE_TIMEOUT_SECONDS" in failed.fix_hint
    # Search never serves a failed job's chunks: the document has no active job.
    with Session(ctx.engine) as session:
        assert session.get(Document, failed.document_id).active_job_id is None


def test_a_second_timeout_in_the_same_stage_of_the_same_file_is_the_files_fault(
    make_ctx, monkeypatch
):
    """Issue 26, finding 10: with three attempts a hostile file cost three full stage timeouts.
    The first timeout is retried (a busy host); the second, same stage, same bytes, is permanent."""
    ctx = make_ctx(
        SLUICE_STAGE_TIMEOUT_SECONDS="2",
        SLUICE_EMBED_BATCH_SIZE="2",
        SLUICE_MAX_ATTEMPTS="3",
        SLUICE_HEARTBEAT_SECONDS="30",
    )
    monkeypatch.setenv("SLUICE_FAULTS", "embed_batch=sleep:2.5")
    r = ingest_bytes(ctx, make_pdf(4), dataset="default", filename="slow.pdf")
    assert run_job(r.job_id, ctx=ctx).result == "retrying"
    first = job(ctx, r.job_id)
    assert (first.error_kind, first.error_code) == (ErrorKind.transient, "stage_timeout")
    assert run_job(r.job_id, ctx=ctx).result == "failed"
    again = job(ctx, r.job_id)
    assert (again.status, again.error_kind, again.attempt) == (
        JobStatus.failed,
        ErrorKind.permanent,
        2,
    )
    assert "ran out of time before on the same file" in again.fix_hint
