"""Parsing: detect the type from the bytes, then read text page by page.

PDFs are read one page at a time with PyMuPDF (never the whole text in one string); .txt and .md
are decoded robustly. Every way a file can be unusable ends in a classified error.
"""

from __future__ import annotations

import codecs
import re
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import filetype

from sluice.errors import PermanentError, UserActionError

PDF = "application/pdf"
TEXT = "text/plain"
MARKDOWN = "text/markdown"
SUPPORTED = (PDF, TEXT, MARKDOWN)
TEXT_PAGE_CHARS = 20_000  # plain text is read in slices of this size, reported as "pages"

NO_TEXT_HINT = "The file has no text layer; it needs OCR. Run it through OCR (e.g. ocrmypdf) and upload again."


def _silence_mupdf() -> None:
    import pymupdf

    pymupdf.TOOLS.mupdf_display_errors(False)
    pymupdf.TOOLS.mupdf_display_warnings(False)


def sniff_type(head: bytes, filename: str = "") -> str:
    """The media type of a file, from its first bytes; the name only tells .md from .txt."""
    if not head:
        raise PermanentError("empty_file", "the file is empty (0 bytes)", "Upload the file again; it arrived empty.")
    if head.lstrip(b"\x00\t\r\n ")[:5] == b"%PDF-" or b"%PDF-" in head[:1024]:
        return PDF
    kind = filetype.guess(head)
    if kind is not None and not kind.mime.startswith("text/"):
        shown = f"{kind.mime} (.{kind.extension})"
        claimed = Path(filename).suffix.lower()
        said = f" although its name ends in {claimed}" if claimed else ""
        raise UserActionError(
            "unsupported_type", f"unsupported file type: the bytes are {shown}{said}",
            "Sluice indexes PDF, .txt and .md files. Convert the file to PDF or text and upload it again.",
        )
    if _looks_like_text(head):
        return MARKDOWN if filename.lower().endswith((".md", ".markdown")) else TEXT
    raise UserActionError(
        "unsupported_type", "unsupported file type: the bytes are neither PDF nor text",
        "Sluice indexes PDF, .txt and .md files. Convert the file and upload it again.",
    )


def _looks_like_text(head: bytes) -> bool:
    if head.startswith((codecs.BOM_UTF8, codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return True
    if b"\x00" in head:
        return False
    sample = head[:8192]
    try:
        sample.decode("utf-8")
        return True
    except UnicodeDecodeError as exc:
        if exc.start >= len(sample) - 4:  # a multi-byte character cut by the sample's end
            return True
    printable = sum(1 for b in sample if b >= 32 or b in (9, 10, 13))
    return printable / max(1, len(sample)) > 0.95


def decode_text(data: bytes) -> str:
    for bom, enc in ((codecs.BOM_UTF8, "utf-8-sig"), (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16")):
        if data.startswith(bom):
            return data.decode(enc, errors="replace")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        pass
    try:
        from charset_normalizer import from_bytes

        best = from_bytes(data[:200_000]).best()
        if best is not None and best.encoding:
            return data.decode(best.encoding, errors="replace")
    except ImportError:  # pragma: no cover
        pass
    return data.decode("latin-1")


_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def clean_text(text: str) -> str:
    text = unicodedata.normalize("NFC", text)
    return _CONTROL.sub(" ", text.replace("\r\n", "\n").replace("\r", "\n"))


@dataclass
class ParsedDocument:
    """An opened document: its page count, and its pages read one at a time."""

    media_type: str
    page_count: int
    warnings: list[str] = field(default_factory=list)
    _pdf: object | None = None
    _text: str | None = None

    def pages(self) -> Iterator[tuple[int, str]]:
        """Yield (page number from 1, text) one page at a time."""
        if self._pdf is not None:
            for number in range(self.page_count):
                try:
                    page = self._pdf.load_page(number)
                    text = page.get_text()
                except ValueError as exc:  # "document closed or encrypted"
                    raise UserActionError("password_protected", "the PDF is password-protected",
                                          "Remove the password and upload the file again.") from exc
                except RuntimeError as exc:
                    raise PermanentError("corrupt_pdf", f"page {number + 1} cannot be read: {exc}",
                                         "The PDF is damaged. Re-export it from its source and upload again.") from exc
                yield number + 1, clean_text(text)
        else:
            text = self._text or ""
            for number in range(self.page_count):
                yield number + 1, text[number * TEXT_PAGE_CHARS:(number + 1) * TEXT_PAGE_CHARS]

    def close(self) -> None:
        if self._pdf is not None:
            self._pdf.close()
            self._pdf = None


def open_document(path: Path, *, media_type: str, max_pages: int) -> ParsedDocument:
    """Open a stored blob as the type detected at upload; classify every way it can be unusable."""
    if media_type == PDF:
        return _open_pdf(path, max_pages=max_pages)
    if media_type in (TEXT, MARKDOWN):
        text = clean_text(decode_text(path.read_bytes()))
        if not text.strip():
            raise UserActionError("no_text", "the text file contains only white space",
                                  "Upload a file that has text in it.")
        pages = max(1, -(-len(text) // TEXT_PAGE_CHARS))
        if pages > max_pages:
            raise UserActionError("too_many_pages", f"the text is {len(text)} characters, over the page limit",
                                  "Split the file, or raise SLUICE_MAX_PAGES.")
        return ParsedDocument(media_type, pages, _text=text)
    raise UserActionError("unsupported_type", f"unsupported file type {media_type}",
                          "Sluice indexes PDF, .txt and .md files.")


def _open_pdf(path: Path, *, max_pages: int) -> ParsedDocument:
    import pymupdf

    _silence_mupdf()
    try:
        doc = pymupdf.open(path, filetype="pdf")
    except pymupdf.EmptyFileError as exc:
        raise PermanentError("empty_file", "the file is empty (0 bytes)", "Upload the file again; it arrived empty.") from exc
    except (pymupdf.FileDataError, RuntimeError) as exc:
        raise PermanentError("unreadable_pdf", f"unreadable PDF: {exc}",
                             "The file is not a readable PDF. Re-export it from its source and upload again.") from exc
    warnings = []
    if doc.needs_pass:
        doc.close()
        raise UserActionError("password_protected", "the PDF is password-protected",
                              "Remove the password and upload the file again.")
    if doc.is_repaired:
        tail = _tail(path)
        if doc.page_count == 0:
            doc.close()
            raise PermanentError("unreadable_pdf", "unreadable PDF: it opens as 0 pages even after repair",
                                 "The file is damaged beyond repair. Re-export it from its source; retrying will not help.")
        if b"%%EOF" not in tail:
            doc.close()
            raise PermanentError("truncated_pdf", "the PDF is truncated: it only opens after repair and pages are lost",
                                 "The upload or the file is cut short. Upload the complete file again.")
        warnings.append("the PDF needed repair to open; check the result")
    if doc.page_count == 0:
        doc.close()
        raise PermanentError("no_pages", "the PDF has 0 pages", "The file has no pages; nothing to index.")
    if doc.page_count > max_pages:
        count = doc.page_count
        doc.close()
        raise UserActionError("too_many_pages", f"the PDF has {count} pages, over the limit of {max_pages}",
                              "Split the PDF into smaller files, or raise SLUICE_MAX_PAGES.")
    return ParsedDocument(PDF, doc.page_count, warnings, _pdf=doc)


def _tail(path: Path, size: int = 2048) -> bytes:
    with open(path, "rb") as fh:
        fh.seek(0, 2)
        end = fh.tell()
        fh.seek(max(0, end - size))
        return fh.read()
