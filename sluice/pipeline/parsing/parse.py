"""Parsing: detect the type from the bytes, then read text page by page, in a child process.

Extraction (sluice.pipeline.parsing.extract) runs in a child process with an address-space limit,
and its pages stream back one at a time (never the whole text in one string): a PDF built to exhaust
memory kills only the child, a MuPDF call that never returns is stopped by the deadline or a cancel,
and the calling process (a worker, or the console's previews) never parses a document itself. The
one exception is a .txt or .md file of at most 256 KiB: the same code decodes it in the caller,
since decoding can neither crash nor hang and a fork costs more than such a file. Every way a file
can be unusable ends in a classified error.
"""

from __future__ import annotations

import codecs
import json
import multiprocessing
import os
import re
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import filetype

from sluice.errors import PermanentError, PipelineError, TransientError, UserActionError
from sluice.pipeline.parsing import formats
from sluice.pipeline.parsing.extract import (  # noqa: F401  (re-exported: the runner and tests use them here)
    MARKDOWN,
    MEMORY_HINT,
    NO_TEXT_HINT,
    PDF,
    TEXT,
    TEXT_PAGE_CHARS,
    Refusal,
    Request,
    clean_text,
    decode_text,
    read,
)
from sluice.pipeline.parsing.forking import ExtractProcess, child_env

SUPPORTED = (
    PDF,
    TEXT,
    MARKDOWN,
    formats.DOCX,
    formats.PPTX,
    formats.EPUB,
    formats.HTML,
    formats.CSV,
)
SUPPORTED_NAMES = "PDF, Word (.docx), PowerPoint (.pptx), EPUB, HTML, CSV, .txt and .md files"
# A .txt or .md file up to this size is read in the worker itself: decoding it can neither crash nor
# hang, and a child process would cost more than the file (about 10 ms of CPU per fork, measured).
IN_WORKER_TEXT_BYTES = 256 * 1024
TICK_SECONDS = (
    0.25  # how often a parent waiting for the child checks its deadline and the job's cancel
)


# Names that say "text": a file so named whose bytes decode as text is text, even when its first
# bytes match another format's signature ("BMI-1..." is not image/bmp, "MZ..." not a program).
TEXT_SUFFIXES = (".txt", ".text", ".md", ".markdown", ".csv", ".tsv", "")


def says_text(filename: str, declared: str = "") -> bool:
    """The name (a text suffix, or none) or the declared media type (``text/...``) says text."""
    return Path(filename).suffix.lower() in TEXT_SUFFIXES or declared.lower().startswith("text/")


def sniff_type(head: bytes, filename: str = "", declared: str = "") -> str:
    """The media type of a file, from its first bytes; the name only tells .md from .txt, and a
    signature wins over a name or ``declared`` type that says text only where the rest of the
    bytes agree (they do not decode as text)."""
    if not head:
        raise PermanentError(
            "empty_file", "the file is empty (0 bytes)", "Upload the file again; it arrived empty."
        )
    if _looks_like_pdf(head):
        return PDF
    if head.startswith(b"PK\x03\x04"):
        return (
            formats.ZIP
        )  # which kind (or a bomb) is told by ``archive_type`` once the file is stored
    kind = filetype.guess(head)
    text_said = says_text(filename, declared) and _looks_like_text(head)
    if kind is not None and not kind.mime.startswith("text/") and not text_said:
        shown = f"{kind.mime} (.{kind.extension})"
        claimed = Path(filename).suffix.lower()
        said = f" although its name ends in {claimed}" if claimed else ""
        raise UserActionError(
            "unsupported_type",
            f"unsupported file type: the bytes are {shown}{said}",
            f"Sluice indexes {SUPPORTED_NAMES}. Convert the file to one of those and upload it "
            "again.",
        )
    if _looks_like_text(head):
        text = decode_text(head)
        if _looks_like_html(text):
            return formats.HTML
        if filename.lower().endswith((".csv", ".tsv")) and formats.looks_like_csv(text):
            return formats.CSV
        return MARKDOWN if filename.lower().endswith((".md", ".markdown")) else TEXT
    raise UserActionError(
        "unsupported_type",
        "unsupported file type: the bytes are neither PDF nor text",
        f"Sluice indexes {SUPPORTED_NAMES}. Convert the file and upload it again.",
    )


_HTML_START = re.compile(
    r"^(?:\s|<!--.*?-->)*<(?:!doctype\s+html|html[\s>])", re.IGNORECASE | re.DOTALL
)


def _looks_like_html(text: str) -> bool:
    """A page that begins as HTML does (a doctype or an <html> tag, after blanks and comments), or
    a fragment with both a <head> or <body> tag and a closing tag."""
    text = text.lstrip("\ufeff")
    if _HTML_START.match(text[:4096]):
        return True
    lower = text[:8192].lower()
    return ("<body" in lower or "<head" in lower) and "</" in lower


_PDF_OBJECT = re.compile(rb"\d{1,10}[ \t\r\n]+\d{1,5}[ \t\r\n]+obj\b")
_PDF_COMMENT_OR_SPACE = re.compile(rb"(?:[\x00\t\r\n\f ]|%[^\r\n]*[\r\n])*")


def _looks_like_pdf(head: bytes) -> bool:
    """As PDF readers sniff: a %PDF- header within the first 1 KB, or, when the header line was
    lost, a file that begins (after blank or comment lines) with an indirect object and holds
    ``endobj``. Text that merely mentions "1 0 obj" does not begin with one."""
    if b"%PDF-" in head[:1024]:
        return True
    lead = _PDF_COMMENT_OR_SPACE.match(head)
    start = lead.end() if lead else 0
    return bool(_PDF_OBJECT.match(head, start)) and b"endobj" in head


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


@dataclass(frozen=True)
class ParseLimits:
    """Bounds on one extraction; ``from_settings`` reads them from the SLUICE_PARSE_* settings."""

    max_page_chars: int = 200_000
    max_document_chars: int = 20_000_000
    max_memory_mb: int = 1024
    seconds: float = 900.0
    archive_max_entries: int = 10_000
    archive_max_bytes: int = 500 * 1024 * 1024

    @classmethod
    def from_settings(cls, settings) -> ParseLimits:
        return cls(
            settings.parse_max_page_chars,
            settings.parse_max_document_chars,
            settings.parse_max_memory_mb,
            settings.stage_timeout_seconds,
            settings.archive_max_entries,
            settings.archive_max_uncompressed_mb * 1024 * 1024,
        )


@dataclass(frozen=True)
class OcrOptions:
    """How pages without a usable text layer are read: SLUICE_OCR_MODE, _DPI and _LANGUAGE."""

    mode: str = "auto"  # auto | always | off
    dpi: int = 200
    language: str = "eng"
    cleanup: bool = (
        True  # despeckle and straighten scans first; off only to measure what that gains
    )

    @classmethod
    def from_settings(cls, settings) -> OcrOptions:
        return cls(settings.ocr_mode, settings.ocr_dpi, settings.ocr_language)


Waiting = Callable[[int, int], None]  # called with (pages done, page count) while the child works


def _timeout(name: str, seconds: float) -> PermanentError:
    return PermanentError(
        "stage_timeout",
        f"parsing {name} took longer than {seconds:.0f}s",
        "The document is too heavy to process in time. Split it, or raise "
        "SLUICE_STAGE_TIMEOUT_SECONDS.",
    )


class _Forked:
    """A forked extraction process with the face of the ``subprocess.Popen`` the parser used
    before."""

    def __init__(self, request: Request, err_path: str) -> None:
        from sluice.pipeline.parsing import extract

        reader, writer = multiprocessing.Pipe(duplex=False)
        self.process = ExtractProcess(
            target=extract.forked,
            args=(asdict(request), writer, err_path, child_env()),
            name="sluice-extract",
            daemon=True,
        )
        try:
            self.process.start()
        finally:
            # the child holds the only write end: its exit is the reader's end of file
            writer.close()
        self.stdout = reader
        self.pid = self.process.pid

    def poll(self) -> int | None:
        return self.process.exitcode

    def kill(self) -> None:
        self.process.kill()

    def wait(self, timeout: float | None = None) -> int | None:
        self.process.join(timeout)
        if self.process.exitcode is None:
            raise subprocess.TimeoutExpired(
                "sluice-extract", timeout or 0.0
            )  # None waits to the end
        return self.process.exitcode

    @property
    def returncode(self) -> int | None:
        return self.process.exitcode


class _Child:
    """One extraction process and the JSON lines it writes."""

    def __init__(self, request: Request, limits: ParseLimits, waiting: Waiting | None) -> None:
        self.name = request.name
        self.limits = limits
        self.waiting = waiting
        self.deadline = time.monotonic() + limits.seconds
        self.buffer = b""
        self.stderr = tempfile.NamedTemporaryFile(prefix="sluice-extract-", suffix=".err")
        self.proc = _Forked(request, self.stderr.name)
        os.set_blocking(self.proc.stdout.fileno(), False)
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.proc.stdout.fileno(), selectors.EVENT_READ)

    def next(self, done: int, total: int) -> dict:
        """The next message; calls ``waiting`` on every tick, kills the child past its deadline."""
        while b"\n" not in self.buffer:
            left = self.deadline - time.monotonic()
            if left <= 0:
                self.kill()
                raise _timeout(self.name, self.limits.seconds)
            if self.selector.select(timeout=min(TICK_SECONDS, left)):
                try:
                    chunk = os.read(self.proc.stdout.fileno(), 1 << 20)
                except BlockingIOError:  # a spurious wake-up
                    continue
                if not chunk:
                    raise self._died()
                self.buffer += chunk
            elif self.waiting is not None:
                self.waiting(
                    done, total
                )  # may raise JobCancelled or a stage timeout; close() kills
        line, _, self.buffer = self.buffer.partition(b"\n")
        return json.loads(line)

    def _died(self) -> PipelineError:
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.kill()
            code = self.proc.returncode
        self.stderr.seek(0)
        tail = self.stderr.read()[-4000:].decode("utf-8", "replace")
        if code == -signal.SIGXCPU:
            return _timeout(self.name, self.limits.seconds)
        if "MemoryError" in tail or code == -signal.SIGKILL:
            return UserActionError(
                "parse_memory_limit",
                f"reading {self.name} needs more than {self.limits.max_memory_mb} MB of memory",
                MEMORY_HINT,
                detail=tail,
            )
        if code is not None and code < 0:
            return PermanentError(
                "parser_crashed",
                f"reading {self.name} crashed the PDF reader ({signal.Signals(-code).name})",
                "The file trips a bug in the PDF reader. Re-export it from its source and "
                "upload again; retrying will not help.",
                detail=tail,
            )
        return TransientError(
            "parser_failed",
            f"the text extraction process stopped with exit code {code}",
            "Sluice retries this; if it keeps failing, the detail shows why.",
            detail=tail,
        )

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:  # pragma: no cover - a process that ignores SIGKILL
            pass

    def close(self) -> None:
        self.kill()
        self.selector.close()
        self.proc.stdout.close()
        self.stderr.close()


class _InWorker:
    """The messages of a small text file, read in the calling process by the same code a child runs
    (``extract.read``), with the face of a ``_Child``."""

    def __init__(self, request: Request, waiting: Waiting | None) -> None:
        self.name = request.name
        self.waiting = waiting
        self._messages = read(request)

    def next(self, done: int, total: int) -> dict:
        try:
            return next(self._messages)
        except Refusal as exc:
            return exc.message_of()
        except Exception as exc:  # what a child's death would say (the file's name, never its path)
            raise TransientError(
                "parser_failed",
                f"reading {self.name} failed ({type(exc).__name__})",
                "Sluice retries this; if it keeps failing, the detail shows why.",
                detail=f"{type(exc).__name__}: {exc}",
            ) from exc

    def close(self) -> None:
        self._messages.close()


def _small_text(path: Path, media_type: str) -> bool:
    try:
        return media_type in (TEXT, MARKDOWN) and os.path.getsize(path) <= IN_WORKER_TEXT_BYTES
    except OSError:  # a child says what is wrong with the file, as for any other
        return False


def _refusal(message: dict) -> PipelineError:
    cls = {"permanent": PermanentError, "user_action_required": UserActionError}.get(
        message["kind"], TransientError
    )
    return cls(message["code"], message["message"], message["hint"])


@dataclass
class ParsedDocument:
    """An opened document: its page count, and its pages read one at a time from the child."""

    media_type: str
    page_count: int
    warnings: list[str] = field(default_factory=list)
    _child: _Child | _InWorker | None = None
    ocr_pages: list[int] = field(default_factory=list)  # pages whose text OCR read
    where: dict[int, str] = field(
        default_factory=dict
    )  # page -> "slide 3", "rows 2-201" (not for PDFs)
    # Called with (page, page count) when OCR starts on a page and while it runs; None = not told.
    on_ocr: Waiting | None = None

    def pages(self) -> Iterator[tuple[int, str]]:
        """Yield (page number from 1, text) one page at a time; raise a classified error when the
        file turns out unusable (no text, an XFA form, pages lost) after its last page."""
        child, done = self._child, 0
        if child is None:
            return
        waiting = child.waiting
        try:
            while True:
                message = child.next(done, self.page_count)
                kind = message["t"]
                if kind == "page":
                    done = message["n"]
                    child.waiting = waiting
                    if message.get("ocr"):
                        self.ocr_pages.append(done)
                    if message.get("where"):
                        self.where[done] = message["where"]
                    yield done, message["text"]
                elif kind == "ocr" and self.on_ocr is not None:
                    page, on_ocr = message["n"], self.on_ocr
                    on_ocr(page, self.page_count)
                    child.waiting = lambda _done, total, page=page, on_ocr=on_ocr: on_ocr(
                        page, total
                    )
                elif kind == "warn":
                    self.warnings.append(message["text"])
                elif kind == "end":
                    self.warnings.extend(message["warnings"])
                    return
                elif kind == "error":
                    raise _refusal(message)
        finally:
            self.close()

    def close(self) -> None:
        if self._child is not None:
            self._child.close()
            self._child = None


def open_document(
    path: Path,
    *,
    media_type: str,
    max_pages: int,
    limits: ParseLimits | None = None,
    name: str = "the file",
    waiting: Waiting | None = None,
    ocr: OcrOptions | None = None,
) -> ParsedDocument:
    """Start reading a stored blob as the type detected at upload, in a child process (a small text
    file in this one); return once
    its page count is known. ``name`` stands for the blob in every message (never its path);
    ``waiting(done, total)`` is called every quarter second while the child works, so a caller
    can stop it (raise) on a cancel or its own deadline."""
    limits = limits or ParseLimits()
    ocr = ocr or OcrOptions()
    if media_type not in SUPPORTED:
        raise UserActionError(
            "unsupported_type",
            f"unsupported file type {media_type}",
            f"Sluice indexes {SUPPORTED_NAMES}.",
        )
    request = Request(
        path=str(path),
        media_type=media_type,
        name=name,
        max_pages=max_pages,
        max_page_chars=limits.max_page_chars,
        max_document_chars=limits.max_document_chars,
        max_memory_mb=limits.max_memory_mb,
        cpu_seconds=int(limits.seconds) + 5,
        ocr=ocr.mode,
        ocr_dpi=ocr.dpi,
        ocr_language=ocr.language,
        ocr_cleanup=ocr.cleanup,
        archive_max_entries=limits.archive_max_entries,
        archive_max_bytes=limits.archive_max_bytes,
    )
    child = (
        _InWorker(request, waiting)
        if _small_text(path, media_type)
        else _Child(request, limits, waiting)
    )
    try:
        message = child.next(0, 0)
        if message["t"] == "error":
            raise _refusal(message)
        if message["t"] != "open":  # pragma: no cover - a protocol error
            raise TransientError(
                "parser_failed", f"unexpected first message from the extractor: {message['t']}"
            )
    except BaseException:
        child.close()
        raise
    return ParsedDocument(media_type, message["pages"], list(message["warnings"]), _child=child)


def decrypt_pdf(
    path: Path,
    password: str,
    out: Path,
    *,
    limits: ParseLimits | None = None,
    name: str = "the file",
) -> int:
    """Write the password-protected PDF at ``path`` to ``out`` without its encryption; return its
    page count. The child process that opens it gets the password, the request (with the file's
    name) and both paths on its stdin, never in its arguments (``ps`` shows those to every user) or
    its environment (``child_env``: none of Sluice's secrets either); it can neither dump core nor
    be read by another process (``extract.keep_private``). A wrong password raises
    UserActionError("wrong_password")."""
    limits = limits or ParseLimits()
    request = Request(
        path=str(path),
        media_type=PDF,
        name=name,
        max_memory_mb=limits.max_memory_mb,
        cpu_seconds=int(limits.seconds) + 5,
    )
    head = json.dumps({"request": asdict(request), "out": str(out)}) + "\n"
    try:
        done = subprocess.run(
            [sys.executable, "-m", "sluice.pipeline.parsing.extract", "--decrypt"],
            input=head.encode("utf-8") + password.encode("utf-8"),
            capture_output=True,
            env=child_env(),
            timeout=limits.seconds,
            close_fds=True,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise _timeout(name, limits.seconds) from exc
    lines = done.stdout.decode("utf-8", "replace").splitlines()
    message = json.loads(lines[-1]) if lines else {}
    if message.get("t") == "decrypted":
        return int(message["pages"])
    if message.get("t") == "error":
        raise _refusal(message)
    tail = (
        done.stderr.decode("utf-8", "replace")[-2000:].replace(password, "***") if password else ""
    )
    raise TransientError(
        "parser_failed",
        f"the decryption process stopped with exit code {done.returncode}",
        "Try again; if it keeps failing, the detail shows why.",
        detail=tail,
    )


@dataclass(frozen=True)
class PageImage:
    png: bytes
    found: int  # places where the located words were found
    zoom: float  # the zoom it was drawn at (less than asked for a page over the pixel cap)
    width: float  # the page's size in points
    height: float


def render_pdf_page(
    path: Path,
    page: int,
    *,
    locate: str | None,
    zoom: float,
    max_pixels: int,
    seconds: float,
    limits: ParseLimits | None = None,
    name: str = "the file",
) -> PageImage | None:
    """Page ``page`` of the PDF at ``path`` as a PNG, drawn in a child process with the extraction
    limits (memory, CPU) and ``seconds`` of wall time, at most ``max_pixels`` pixels (the zoom is
    lowered to fit); None for a page it does not have or a locked file. A file that cannot be
    drawn within the limits raises a classified PipelineError, never takes the caller down."""
    limits = limits or ParseLimits()
    request = Request(
        path=str(path),
        media_type=PDF,
        name=name,
        max_memory_mb=limits.max_memory_mb,
        cpu_seconds=int(seconds) + 1,
    )
    spec = {"page": page, "locate": locate, "zoom": zoom, "max_pixels": max_pixels}
    with tempfile.TemporaryDirectory(prefix="sluice-page-") as tmp:
        out = Path(tmp) / "page.png"
        head = json.dumps({"request": asdict(request), "page": spec, "out": str(out)}) + "\n"
        try:
            done = subprocess.run(
                [sys.executable, "-m", "sluice.pipeline.parsing.extract", "--render"],
                input=head.encode("utf-8"),
                capture_output=True,
                env=child_env(),
                timeout=seconds,
                close_fds=True,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise PermanentError(
                "render_timeout",
                f"drawing page {page} of {name} took longer than {seconds:.0f}s",
                "Its text is indexed; open the original to see the page.",
            ) from exc
        lines = done.stdout.decode("utf-8", "replace").splitlines()
        message = json.loads(lines[-1]) if lines else {}
        if message.get("t") == "rendered":
            return PageImage(
                out.read_bytes(),
                int(message["found"]),
                float(message["zoom"]),
                float(message["width"]),
                float(message["height"]),
            )
    if message.get("t") == "none":
        return None
    if message.get("t") == "error":
        raise _refusal(message)
    raise PermanentError(
        "render_failed",
        f"drawing page {page} of {name} stopped the drawing process (exit code {done.returncode})",
        "Its text is indexed; open the original to see the page.",
        detail=done.stderr.decode("utf-8", "replace")[-2000:],
    )


def archive_type(path: Path, *, name: str, limits: ParseLimits | None = None) -> str:
    """The type of a stored ZIP upload (DOCX, PPTX or EPUB); a classified error for a zip bomb or
    another archive. Reads only the archive's directory, never decompresses."""
    limits = limits or ParseLimits()
    try:
        return formats.archive_type(
            path,
            name=name,
            max_entries=limits.archive_max_entries,
            max_bytes=limits.archive_max_bytes,
        )
    except formats.FormatRefusal as exc:
        raise _refusal(
            {"kind": exc.kind, "code": exc.code, "message": exc.message, "hint": exc.hint}
        ) from exc
