"""Text extraction, run in a child process:
``python -m sluice.pipeline.parsing.extract '<json request>'``.

A PDF can be built to exhaust memory (a 122 KB file whose one content stream shows 27 million
characters) or to keep MuPDF busy forever. So extraction runs in its own process, with an
address-space limit, and the parent (sluice.pipeline.parsing.parse) reads its pages as they come and
kills it on a deadline or a cancel. The child writes one JSON object per line on stdout:

    {"t": "open", "pages": N, "warnings": [...]}       opened; N pages will follow
    {"t": "ocr", "n": 3}                               page 3 has no usable text layer: OCR reads it
    {"t": "page", "n": 3, "text": "...", "ocr": true}  one page, in order from 1 (ocr: OCR read it)
    {"t": "warn", "text": "..."}                       for the job to say (page skipped, text cut)
    {"t": "end", "warnings": [...]}                    every page was sent; warnings on the file
    {"t": "error", "kind": ..., "code": ..., "message": ..., "hint": ...}   a classified refusal

``python -m sluice.pipeline.parsing.extract --render`` reads a line ``{"request": ..., "page":
{...}, "out": OUT}`` and draws one PDF page into OUT (``render``): the console's page images.
``python -m sluice.pipeline.parsing.extract --decrypt`` reads a line ``{"request": ..., "out":
OUT}`` and then the password on stdin (neither on the command line, which every user of the machine
can read: not even the file's name), and writes the PDF without its encryption to OUT: {"t":
"decrypted", "pages": N}, or an error ("wrong_password"). Before it reads the password it makes
itself undumpable (``keep_private``): no core file, no reading of its memory by another process of
the same user.

This module imports nothing from Sluice but the reading order, the table and heading finders, the
chunker's marks and the fault points, so the child starts in about a tenth of a second; the
``Refusal`` it raises becomes a PipelineError in the parent.
"""

from __future__ import annotations

import gc
import json
import os
import re
import resource
import sys
import traceback
import unicodedata
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field

from sluice import faults
from sluice.pipeline.parsing import formats, ocr
from sluice.pipeline.parsing.headings import PdfHeadings, markdown_headings, text_pages
from sluice.pipeline.parsing.reading import lines_of, ordered_text
from sluice.pipeline.parsing.tables import take_tables
from sluice.pipeline.running.chunk import meaningful, strip_marks

PDF = "application/pdf"
TEXT = "text/plain"
MARKDOWN = "text/markdown"
TEXT_PAGE_CHARS = 20_000  # plain text is read in slices of this size, reported as "pages"

NO_TEXT_HINT = (
    "The file has no text layer; it needs OCR. Run it through OCR (e.g. ocrmypdf) and upload again."
)
OCR_OFF_HINT = (
    "The file has no text layer and OCR is off (SLUICE_OCR_MODE=off). Set SLUICE_OCR_MODE=auto "
    "and retry, or run it through OCR yourself and upload again."
)
NO_TEXT_BY_OCR_HINT = (
    "OCR read every page image and found no words: the pages are pictures. There is nothing "
    "to index; if they are scans of text, scan again at 300 dpi or more and upload that file."
)
DAMAGED_HINT = (
    "The PDF is damaged. Re-export it from its source and upload again; retrying will not help."
)
MEMORY_HINT = (
    "The file needs more memory to read than a worker allows; it may be built to exhaust memory. "
    "Re-export or split it, or raise SLUICE_PARSE_MAX_MEMORY_MB if the file is trusted."
)
XFA_HINT = (
    "Open the form in Adobe Acrobat or Reader and print it to PDF (or flatten the form), "
    "then upload that file."
)

XFA_PLACEHOLDER = (
    "if this message is not eventually replaced by the proper contents of the document"
)


class Refusal(Exception):
    """A file that cannot be indexed, classified the way sluice.errors classifies (by kind name)."""

    def __init__(self, kind: str, code: str, message: str, hint: str) -> None:
        super().__init__(message)
        self.kind, self.code, self.message, self.hint = kind, code, message, hint

    def message_of(self) -> dict:
        """The protocol's error message for this refusal."""
        return {
            "t": "error",
            "kind": self.kind,
            "code": self.code,
            "message": self.message,
            "hint": self.hint,
        }


@dataclass
class Request:
    path: str
    media_type: str
    name: str = "the file"
    max_pages: int = 5000
    max_page_chars: int = 200_000
    max_document_chars: int = 20_000_000
    max_memory_mb: int = 0  # 0 = no address-space limit
    cpu_seconds: int = 0  # 0 = no CPU limit
    # auto: pages without usable text that show an image (or undecodable fonts); always; off
    ocr: str = "auto"
    ocr_dpi: int = 200
    ocr_language: str = "eng"
    ocr_cleanup: bool = True  # despeckle and straighten scans before Tesseract (off: as rendered)
    archive_max_entries: int = 10_000
    archive_max_bytes: int = 500 * 1024 * 1024


_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def clean_text(text: str) -> str:
    text = unicodedata.normalize("NFC", text)
    return _CONTROL.sub(" ", text.replace("\r\n", "\n").replace("\r", "\n"))


def decode_text(data: bytes) -> str:
    import codecs

    for bom, enc in (
        (codecs.BOM_UTF8, "utf-8-sig"),
        (codecs.BOM_UTF16_LE, "utf-16"),
        (codecs.BOM_UTF16_BE, "utf-16"),
    ):
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


def _plain(exc: BaseException, req: Request) -> str:
    """An exception's text with the stored blob path replaced by the file's own name."""
    text = str(exc)
    for form in {req.path, os.path.abspath(req.path)}:
        text = text.replace(form, req.name)
    return re.sub(r"code=\d+: ", "", text)[:300]


def read(req: Request) -> Generator[dict, None, None]:
    """The messages of the protocol, for any supported type."""
    if req.media_type == PDF:
        yield from _read_pdf(req)
    elif req.media_type in (TEXT, MARKDOWN):
        yield from _read_text(req)
    elif req.media_type in SECTIONED:
        try:
            yield from _read_sections(req)
        except formats.FormatRefusal as exc:
            raise Refusal(exc.kind, exc.code, exc.message, exc.hint) from exc
    else:
        raise Refusal(
            "user_action_required",
            "unsupported_type",
            f"unsupported file type {req.media_type}",
            "Sluice indexes PDF, .txt and .md files.",
        )


SECTIONED = (formats.DOCX, formats.PPTX, formats.EPUB, formats.HTML, formats.CSV)


def _sections(req: Request) -> list[tuple[str, str]]:
    if req.media_type in (formats.HTML, formats.CSV):
        if os.path.getsize(req.path) > 4 * req.max_document_chars:
            raise _too_much_text(req)
        with open(req.path, "rb") as fh:
            text = decode_text(fh.read())
        return (
            formats.html_sections(text, name=req.name)
            if req.media_type == formats.HTML
            else formats.csv_sections(text)
        )
    archive = formats.BoundedZip(
        req.path,
        name=req.name,
        max_entries=req.archive_max_entries,
        max_bytes=req.archive_max_bytes,
    )
    try:
        archive.check_all()
        if req.media_type == formats.EPUB:
            return formats.epub_sections(archive)
    finally:
        archive.close()
    reader = formats.docx_sections if req.media_type == formats.DOCX else formats.pptx_sections
    return reader(req.path)


def _read_sections(req: Request) -> Iterator[dict]:
    """A document read as labelled sections (a slide, a section under a heading, a range of rows),
    each sent as one page with its label in "where"."""
    try:
        sections = _sections(req)
    except (formats.FormatRefusal, Refusal):
        raise
    except Exception as exc:  # a damaged file: the libraries raise their own errors
        if _is_memory_error(exc):
            raise
        raise Refusal(
            "permanent",
            "unreadable_document",
            f"{req.name} cannot be read: {_plain(exc, req)}",
            "Re-export the file from its source and upload it again; retrying will not help.",
        ) from exc
    sections = [(label, clean_text(text)) for label, text in sections]
    if not any(meaningful(text) for _, text in sections):
        raise Refusal(
            "user_action_required",
            "no_text",
            f"{req.name} holds no meaningful text",
            "Upload a file that has text in it.",
        )
    if len(sections) > req.max_pages:
        raise Refusal(
            "user_action_required",
            "too_many_pages",
            f"{req.name} has {len(sections)} sections, over the limit of {req.max_pages}",
            "Split the file, or raise SLUICE_MAX_PAGES.",
        )
    if sum(len(text) for _, text in sections) > req.max_document_chars:
        raise _too_much_text(req)
    yield {"t": "open", "pages": len(sections), "warnings": []}
    for number, (label, text) in enumerate(sections, start=1):
        yield {"t": "page", "n": number, "text": text if meaningful(text) else "", "where": label}
    yield {"t": "end", "warnings": []}


def _read_text(req: Request) -> Iterator[dict]:
    if os.path.getsize(req.path) > 4 * req.max_document_chars:  # refused before it is read
        raise _too_much_text(req)
    with open(req.path, "rb") as fh:
        text = clean_text(strip_marks(decode_text(fh.read())))
    if req.media_type == MARKDOWN:
        text = markdown_headings(text)
    if not meaningful(text):
        raise Refusal(
            "user_action_required",
            "no_text",
            f"{req.name} holds no meaningful text (only white space, punctuation or a number)",
            "Upload a file that has text in it.",
        )
    if len(text) > req.max_document_chars:
        raise _too_much_text(req)
    pages = max(1, -(-len(text) // TEXT_PAGE_CHARS))
    if pages > req.max_pages:
        raise Refusal(
            "user_action_required",
            "too_many_pages",
            f"the text is {len(text)} characters, over the page limit",
            "Split the file, or raise SLUICE_MAX_PAGES.",
        )
    yield {"t": "open", "pages": pages, "warnings": []}
    for number, page in enumerate(text_pages(text, TEXT_PAGE_CHARS), start=1):
        yield {"t": "page", "n": number, "text": page}
    yield {"t": "end", "warnings": []}


def _too_much_text(req: Request) -> Refusal:
    return Refusal(
        "user_action_required",
        "too_much_text",
        f"{req.name} holds more than {req.max_document_chars:,} characters of text",
        "Split the document, or raise SLUICE_PARSE_MAX_DOCUMENT_CHARS.",
    )


def _unreadable(req: Request, why: str) -> Refusal:
    return Refusal("permanent", "unreadable_pdf", f"unreadable PDF {req.name}: {why}", DAMAGED_HINT)


def _pages(numbers: list[int]) -> str:
    """ "page 2", "pages 2, 5-7"."""
    return ("page " if len(numbers) == 1 else "pages ") + _ranges(numbers)


def _ranges(numbers: list[int]) -> str:
    out: list[str] = []
    for n in numbers:
        if out and out[-1].split("-")[-1] == str(n - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{n}"
        else:
            out.append(str(n))
    return ", ".join(out)


_NO_MEMORY = re.compile(r"alloc\b.*\bfailed|out of memory", re.IGNORECASE)


def _is_memory_error(exc: BaseException) -> bool:
    return isinstance(exc, MemoryError) or bool(_NO_MEMORY.search(str(exc)))


def skip_optional_pymupdf_imports() -> None:
    """PyMuPDF imports pymupdf_layout and pymupdf4llm when they are installed: 0.3 s and, with numpy
    and onnxruntime, about 100 MB. Extraction needs neither; call this before PyMuPDF is
    imported."""
    for optional in ("pymupdf.layout", "pymupdf4llm"):
        sys.modules.setdefault(optional, None)  # type: ignore[arg-type]  # None blocks an import


def _open_pdf(req: Request):
    skip_optional_pymupdf_imports()
    import pymupdf

    pymupdf.TOOLS.mupdf_display_errors(False)
    pymupdf.TOOLS.mupdf_display_warnings(False)
    try:
        return pymupdf.open(req.path, filetype="pdf")
    except pymupdf.EmptyFileError as exc:
        raise Refusal(
            "permanent",
            "empty_file",
            f"{req.name} is empty (0 bytes)",
            "Upload the file again; it arrived empty.",
        ) from exc
    except Exception as exc:  # FileDataError, RuntimeError, and MuPDF's plain Exceptions
        if _is_memory_error(exc):
            raise
        raise _unreadable(req, _plain(exc, req)) from exc


def _read_pdf(req: Request) -> Iterator[dict]:
    doc = _open_pdf(req)
    try:
        if doc.needs_pass:
            raise Refusal(
                "user_action_required",
                "password_protected",
                f"{req.name} is password-protected",
                PASSWORD_HINT,
            )
        try:
            count = doc.page_count
        except Exception as exc:
            raise _unreadable(req, f"its pages cannot be counted ({_plain(exc, req)})") from exc
        repaired = bool(doc.is_repaired)
        if count == 0:
            why = "it opens as 0 pages even after repair" if repaired else "it has 0 pages"
            raise _unreadable(req, why)
        if count > req.max_pages:
            raise Refusal(
                "user_action_required",
                "too_many_pages",
                f"{req.name} has {count} pages, over the limit of {req.max_pages}",
                "Split the PDF into smaller files, or raise SLUICE_MAX_PAGES.",
            )
        yield {"t": "open", "pages": count, "warnings": []}
        yield from _pdf_pages(doc, req, count, repaired)
    finally:
        doc.close()


@dataclass
class _PdfTally:
    """What the pages of a PDF yielded so far: the verdict on the whole file is made from it."""

    total: int = 0  # characters sent
    meaningful_pages: int = 0
    broken: list[int] = field(default_factory=list)
    # pages whose content is gone from a repaired (cut) file
    lost: list[int] = field(default_factory=list)
    empty: list[int] = field(default_factory=list)
    # text in fonts that map no characters (lost or broken ToUnicode)
    undecodable: list[int] = field(default_factory=list)
    number_only: list[int] = field(default_factory=list)
    # pages that need more memory than the limit to extract (text bombs)
    too_big: list[int] = field(default_factory=list)
    has_images: bool = False
    has_drawings: bool = False
    read_by_ocr: list[int] = field(default_factory=list)  # pages whose text OCR read
    ocr_tried: list[int] = field(default_factory=list)
    pictures: list[int] = field(default_factory=list)  # pages where OCR ran and found no text
    ocr_missing: str = ""  # why OCR could not run (Tesseract or the language not installed)
    placeholder: bool = False
    first_error: str = ""
    headings: PdfHeadings = field(default_factory=PdfHeadings)  # the outline and the path so far


def _pdf_pages(doc, req: Request, count: int, repaired: bool) -> Iterator[dict]:
    """Every page in order, then the verdict on the file: a refusal, or the end with its
    warnings."""
    import pymupdf

    flags = pymupdf.TEXTFLAGS_TEXT & ~pymupdf.TEXT_PRESERVE_IMAGES
    tally = _PdfTally(headings=PdfHeadings.of(doc))
    for index in range(count):
        faults.hit("extract_page")
        yield from _pdf_page(doc, req, index + 1, flags, repaired, tally)
    _refuse_unreadable_pdf(doc, req, count, tally)
    if tally.meaningful_pages == 0:
        raise _no_text_refusal(req, tally)
    yield {"t": "end", "warnings": _pdf_warnings(req, repaired, tally)}


def _pdf_page(
    doc, req: Request, number: int, flags: int, repaired: bool, tally: _PdfTally
) -> Iterator[dict]:
    """One page's messages: its text, or an empty page when it cannot be read (counted in tally)."""
    try:
        text = yield from _pdf_page_text(doc, req, number, flags, repaired, tally)
    except Exception as exc:  # FzErrorFormat and friends arrive as plain Exceptions
        if _is_memory_error(exc):  # MuPDF frees what the page took; the next page gets it back
            traceback.clear_frames(exc.__traceback__)  # the page, as the reading frames held it
            gc.collect()
            tally.too_big.append(number)
            yield {"t": "page", "n": number, "text": ""}
            return
        # "document closed or encrypted"
        if isinstance(exc, ValueError) and "encrypted" in str(exc):
            raise Refusal(
                "user_action_required",
                "password_protected",
                f"{req.name} is password-protected",
                PASSWORD_HINT,
            ) from exc
        tally.broken.append(number)
        tally.first_error = tally.first_error or _plain(exc, req)
        yield {"t": "page", "n": number, "text": ""}
        return
    yield from _keep_pdf_page(req, number, text, tally)


def _pdf_page_text(
    doc, req: Request, number: int, flags: int, repaired: bool, tally: _PdfTally
) -> Generator[dict, None, str]:
    """A page's text layer, or what OCR reads of it ("ocr" announced first); returns the text."""
    page = doc.load_page(number - 1)
    start = tally.headings.start()  # the headings in force where the page starts
    raw = _structured_text(page, number, flags, tally.headings)
    if _undecodable(raw):  # glyph ids, not characters: its fonts map no text
        (tally.lost if repaired else tally.undecodable).append(number)
        raw = ""
    text = clean_text(raw)
    pictured = False
    worth = meaningful(text)
    if not worth:  # a scan may carry a stamped page number and nothing else
        pictured = bool(page.get_images(full=False))
        tally.has_images = tally.has_images or pictured
    if not text.strip():
        tally.has_drawings = tally.has_drawings or bool(page.get_cdrawings())
        if repaired and number not in tally.lost and _contents_lost(doc, page):
            tally.lost.append(number)
    # Not a page of undecodable text: its font may be lost too, and OCR would read the
    # fallback glyphs as a shifted alphabet ("JBSCPVS" for "Harbour"). "always" reads them all.
    wants_ocr = req.ocr == "always" or (req.ocr == "auto" and pictured)
    if wants_ocr and not tally.ocr_missing:
        yield {"t": "ocr", "n": number}
        text = _ocr_pdf_page(page, req, number, text, tally)
        worth = meaningful(text)
    return f"{start}\n{text}" if start and worth else text


def _structured_text(page, number: int, flags: int, headings: PdfHeadings) -> str:
    """The page's text in reading order, its tables as Markdown rows and its headings marked
    (``headings`` follows them into the next page)."""
    lines = lines_of(page.get_text("dict", flags=flags, sort=False))
    lines = take_tables(page, lines)
    lines = headings.mark(number, lines, page.rect.height)
    text = ordered_text(lines)
    headings.outline.follow(text)
    return text


def _ocr_pdf_page(page, req: Request, number: int, text: str, tally: _PdfTally) -> str:
    """The page's text as OCR reads it, where it reads words (or always with "always")."""
    tally.ocr_tried.append(number)
    try:
        png, dpi = ocr.render(page, req.ocr_dpi, cleanup=req.ocr_cleanup)
        seen = clean_text(strip_marks(ocr.recognise(png, dpi=dpi, language=req.ocr_language)))
        del png
    except ocr.OcrUnavailable as exc:
        tally.ocr_missing = str(exc)
        tally.ocr_tried.pop()
        seen = ""
    if meaningful(seen) or req.ocr == "always":
        text = seen
    if meaningful(seen):
        tally.read_by_ocr.append(number)
        if number in tally.undecodable:
            tally.undecodable.remove(number)
    return text


def _keep_pdf_page(req: Request, number: int, text: str, tally: _PdfTally) -> Iterator[dict]:
    """The page message of a page read: its text cut to the page limit, or empty and classed."""
    if len(text) > req.max_page_chars:
        yield {
            "t": "warn",
            "text": f"page {number} holds {len(text):,} characters; only the first "
            f"{req.max_page_chars:,} are indexed (SLUICE_PARSE_MAX_PAGE_CHARS)",
        }
        text = text[: req.max_page_chars]
    tally.total += len(text)
    if tally.total > req.max_document_chars:
        raise _too_much_text(req)
    if XFA_PLACEHOLDER in " ".join(text.lower().split()):
        tally.placeholder = True
    if not meaningful(text):
        if number in tally.ocr_tried:
            tally.pictures.append(number)
        else:
            (tally.number_only if text.strip() else tally.empty).append(number)
        text = ""
    else:
        tally.meaningful_pages += 1
    if number in tally.read_by_ocr and text:
        yield {"t": "page", "n": number, "text": text, "ocr": True}
    else:
        yield {"t": "page", "n": number, "text": text}


def _refuse_unreadable_pdf(doc, req: Request, count: int, tally: _PdfTally) -> None:
    """Raises when the file's pages were too big, broken or lost, or it is an XFA form."""
    if tally.too_big and tally.meaningful_pages == 0:
        raise Refusal(
            "user_action_required",
            "parse_memory_limit",
            f"reading {req.name} needs more than {req.max_memory_mb} MB of memory "
            f"({_pages(tally.too_big)})",
            MEMORY_HINT,
        )
    if len(tally.broken) == count:
        raise _unreadable(req, f"no page can be read ({tally.first_error})")
    if tally.lost:
        # in a file cut short, empty pages are lost ones too
        lost = sorted(set(tally.lost) | set(tally.empty))
        raise Refusal(
            "permanent",
            "truncated_pdf",
            f"{req.name} is truncated: the content or fonts of {_pages(lost)} of {count} are lost",
            "The upload or the file is cut short. Upload the complete file again.",
        )
    if _is_xfa(doc) and (tally.placeholder or tally.meaningful_pages == 0):
        raise Refusal(
            "user_action_required",
            "xfa_form",
            f"{req.name} is a dynamic XFA form: its content only appears in Adobe's viewers, and "
            'the file itself holds just a "Please wait..." placeholder',
            XFA_HINT,
        )


def _no_text_refusal(req: Request, tally: _PdfTally) -> Refusal:
    """Why a file none of whose pages holds meaningful text cannot be indexed."""
    if tally.undecodable:
        return Refusal(
            "user_action_required",
            "undecodable_text",
            f"{req.name} has text only in fonts whose characters cannot be decoded "
            "(they map glyphs to no letters)",
            NO_TEXT_HINT,
        )
    if tally.has_images and tally.ocr_tried and not tally.ocr_missing:
        return Refusal(
            "user_action_required",
            "no_text_even_by_ocr",
            f"no text found, even by OCR: {req.name} holds images without text "
            f"(OCR read {_pages(tally.ocr_tried)})",
            NO_TEXT_BY_OCR_HINT,
        )
    if tally.has_images:
        hint = NO_TEXT_HINT
        if tally.ocr_missing:
            hint = (
                f"OCR cannot run: {tally.ocr_missing}. Install it and retry, or run the file "
                "through OCR yourself."
            )
        elif req.ocr == "off":
            hint = OCR_OFF_HINT
        return Refusal(
            "user_action_required",
            "no_text_layer",
            f"{req.name} has no extractable text (scanned images only)",
            hint,
        )
    if tally.has_drawings:
        return Refusal(
            "user_action_required",
            "no_text_drawings_only",
            f"{req.name} has no text and no images: its pages hold only drawings",
            "There is nothing to index. If the drawings are lettering turned into outlines, "
            "re-export the file with its text kept as text.",
        )
    return Refusal(
        "permanent",
        "blank_pages",
        f"{req.name} has no text: every page is blank or holds only a page number",
        "There is nothing to index in this file; check that it is the file you meant.",
    )


def _pdf_warnings(req: Request, repaired: bool, tally: _PdfTally) -> list[str]:
    """What the job should say about a file that is indexed: pages skipped, read by OCR, repair."""
    warnings: list[str] = []
    if tally.too_big:
        one = len(tally.too_big) == 1
        warnings.append(
            f"{_pages(tally.too_big)} {'needs' if one else 'need'} more memory to extract than "
            f"SLUICE_PARSE_MAX_MEMORY_MB ({req.max_memory_mb} MB) allows, and "
            f"{'was' if one else 'were'} skipped (a text bomb, or an extremely dense page)"
        )
    if tally.broken:
        warnings.append(
            f"{_pages(tally.broken)} cannot be read and "
            f"{'was' if len(tally.broken) == 1 else 'were'} skipped ({tally.first_error})"
        )
    if tally.read_by_ocr:
        warnings.append(
            f"{_pages(tally.read_by_ocr)}: no usable text layer; the text was read by OCR "
            f"(Tesseract, {req.ocr_language}), check it against the original"
        )
    if tally.ocr_missing:
        warnings.append(
            f"OCR could not run ({tally.ocr_missing}); pages without a text layer were skipped"
        )
    if tally.undecodable:
        warnings.append(
            f"{_pages(tally.undecodable)}: text in fonts that cannot be decoded, skipped "
            "(OCR would read it)"
        )
    if tally.pictures:
        warnings.append(f"{_pages(tally.pictures)}: images only, OCR found no text, skipped")
    if tally.number_only:
        warnings.append(f"{_pages(tally.number_only)}: only a page number, skipped")
    if tally.empty:
        warnings.append(f"{_pages(tally.empty)}: empty, skipped")
    if repaired:
        warnings.append(
            "the file needed repair to open (a damaged or padded end, or a broken cross-reference "
            "table); no page content was lost, but check the result against the original"
        )
    return warnings


_GLYPH_IDS = re.compile(r"[\x00-\x08\x0e-\x1f]")


def _undecodable(text: str) -> bool:
    """Text made of glyph ids: MuPDF returns a font's raw codes when it has no character map."""
    size = len(text.strip())
    return size > 0 and len(_GLYPH_IDS.findall(text)) > 0.2 * size


def _contents_lost(doc, page) -> bool:
    """A page of a repaired file whose content streams are missing: the file was cut short."""
    try:
        xrefs = page.get_contents()
        if not xrefs:
            return doc.xref_get_key(page.xref, "Contents")[0] not in ("null", "")
        return any(doc.xref_object(x, compressed=True).strip() in ("null", "") for x in xrefs)
    except Exception:
        return True


def _is_xfa(doc) -> bool:
    try:
        kind, _ = doc.xref_get_key(doc.pdf_catalog(), "AcroForm/XFA")
        return kind not in ("null", "")
    except Exception:
        return False


def _limit_resources(req: Request) -> None:
    if req.max_memory_mb > 0:
        limit = req.max_memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    if req.cpu_seconds > 0:
        resource.setrlimit(resource.RLIMIT_CPU, (req.cpu_seconds, req.cpu_seconds + 5))
    try:  # die with the parent rather than outlive it (Linux)
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:  # pragma: no cover - not Linux
        pass


PASSWORD_HINT = (
    "Give the password on the job's page in the console, with `sluice retry JOB "
    "--password-stdin`, or through the API (`POST /v1/jobs/JOB/unlock` with "
    '`{"password": "..."}`); or remove the password and upload the file again.'
)
WRONG_PASSWORD_HINT = (
    "Enter the password again (it is case-sensitive), or remove the password from the file "
    "and upload it again."
)


def decrypt(req: Request, password: str, out_path: str) -> Iterator[dict]:
    """Open a password-protected PDF with ``password`` and write it unencrypted to ``out_path``."""
    import pymupdf

    doc = _open_pdf(req)
    try:
        if not doc.needs_pass:
            raise Refusal(
                "user_action_required",
                "not_password_protected",
                f"{req.name} opens without a password",
                "Retry the job without a password.",
            )
        if not doc.authenticate(password):
            raise Refusal(
                "user_action_required",
                "wrong_password",
                f"wrong password: the password given does not open {req.name}",
                WRONG_PASSWORD_HINT,
            )
        faults.hit("decrypt_authenticated")
        pages = doc.page_count
        none = pymupdf.PDF_ENCRYPT_NONE  # type: ignore[attr-defined]  # defined, not declared
        doc.save(out_path, encryption=none, garbage=1, deflate=True)
    finally:
        doc.close()
    yield {"t": "decrypted", "pages": pages}


LOCATE_WORDS = 8  # the first words of a chunk, searched for on its page
MIN_ZOOM = 0.02  # a page that fits the pixel cap only below this is not drawn at all


def render(req: Request, spec: dict, out_path: str) -> Iterator[dict]:
    """Draw page ``spec["page"]`` of a PDF as a PNG at ``out_path``, at ``spec["zoom"]`` or less:
    never more than ``spec["max_pixels"]`` pixels (a 1 KB file can declare a page of 200 inches),
    with the first words of ``spec["locate"]`` highlighted; the pixel size is checked before
    MuPDF allocates anything."""
    import math

    import pymupdf

    doc = _open_pdf(req)
    try:
        page = int(spec["page"])
        if doc.needs_pass or not 1 <= page <= doc.page_count:
            yield {"t": "none"}
            return
        p = doc[page - 1]
        width, height = max(p.rect.width, 1.0), max(p.rect.height, 1.0)
        zoom = min(float(spec["zoom"]), math.sqrt(int(spec["max_pixels"]) / (width * height)))
        if zoom < MIN_ZOOM:
            raise Refusal(
                "user_action_required",
                "page_too_large",
                f"page {page} of {req.name} is {width:.0f} x {height:.0f} points, too large to "
                "draw",
                "Its text is indexed; open the original to see the page.",
            )
        found = 0
        words = " ".join((spec.get("locate") or "").split()[:LOCATE_WORDS])
        if words:
            rects = p.search_for(words)
            for r in rects:
                p.add_highlight_annot(r)
            found = len(rects)
        p.get_pixmap(matrix=pymupdf.Matrix(zoom, zoom), annots=True).save(out_path, "png")
    finally:
        doc.close()
    yield {"t": "rendered", "found": found, "zoom": zoom, "width": width, "height": height}


def keep_private() -> None:
    """No core file (RLIMIT_CORE 0) and not dumpable (PR_SET_DUMPABLE 0: nor can another process
    of the same user read this one's memory or environment through /proc or ptrace), for a process
    about to hold a password."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    import ctypes

    if ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0) != 0:  # PR_SET_DUMPABLE
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")


def main(argv: list[str]) -> int:
    if argv[0] == "--decrypt":
        keep_private()  # before a byte of the password is read
        head = json.loads(sys.stdin.buffer.readline())
        req = Request(**head["request"])
        messages = decrypt(req, sys.stdin.buffer.read().decode("utf-8"), head["out"])
    elif argv[0] == "--render":
        head = json.loads(sys.stdin.buffer.readline())
        req = Request(**head["request"])
        messages = render(req, head["page"], head["out"])
    else:
        req = Request(**json.loads(argv[0]))
        messages = read(req)
    _limit_resources(req)
    return _send_all(req, messages, sys.stdout.buffer)


def forked(request: dict, out, err_path: str, env: dict[str, str]) -> None:
    """One document, in a process forked from the parse fork server
    (``sluice.pipeline.parsing.parse``), where this module and PyMuPDF are already imported: a child
    costs a fork, not an interpreter start and an import of PyMuPDF (about 0.3 s of CPU, more than a
    small document's encoding). The same as ``main``: the calling process's environment, the same
    limits, the same messages, written to ``out`` (a pipe's write end), errors to the file
    ``err_path``."""
    from multiprocessing import forkserver

    server = os.getppid()
    # Every child of a fork server holds the write end of the pipe that keeps the server alive
    # while a client may still ask for a fork. Dropped here: a worker killed mid-parse ends its
    # fork server, and the fork server's end ends this child (PR_SET_PDEATHSIG below).
    alive = getattr(forkserver._forkserver, "_forkserver_alive_fd", None)
    if alive is not None:
        os.close(alive)
        forkserver._forkserver._forkserver_alive_fd = None  # type: ignore[attr-defined]  # private
    os.environ.clear()
    os.environ.update(env)
    fd = os.open(err_path, os.O_WRONLY | os.O_APPEND)
    os.dup2(fd, 2)
    os.close(fd)
    req = Request(**request)
    messages = read(req)
    _limit_resources(req)
    if os.getppid() != server:  # the fork server ended before the death signal was armed
        os._exit(1)
    with os.fdopen(out.fileno(), "wb", closefd=False) as stream:
        code = _send_all(req, messages, stream)
    out.close()
    if code:
        sys.exit(code)


def _send_all(req: Request, messages: Iterator[dict], out) -> int:
    def send(message: dict) -> None:
        # UTF-8 whatever the locale; a lone surrogate from a broken font becomes "?"
        out.write(json.dumps(message, ensure_ascii=False).encode("utf-8", "replace") + b"\n")
        out.flush()

    try:
        for message in messages:
            send(message)
    except Refusal as exc:
        send(exc.message_of())
    except BaseException as exc:
        if _is_memory_error(exc):
            send(
                {
                    "t": "error",
                    "kind": "user_action_required",
                    "code": "parse_memory_limit",
                    "message": f"reading {req.name} needs more than {req.max_memory_mb} MB of "
                    "memory",
                    "hint": MEMORY_HINT,
                }
            )
            return 0
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
