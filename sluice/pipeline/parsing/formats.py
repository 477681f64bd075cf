"""Office, web and table formats: .docx, .pptx, .html, .epub and .csv, each told from its bytes.

``archive_type`` looks inside a ZIP file (its central directory only, nothing is decompressed) to
tell a Word document, a PowerPoint deck and an EPUB book apart, and refuses archives beyond the
limits on entry count and uncompressed size (zip bombs). The readers run in the extraction child
(sluice.pipeline.parsing.extract); each returns "sections": (label, text) pairs, where the label
says where the text is (``slide 3``, ``section 2: Results``, ``rows 2-201``), and a section is what
the job reports as a page. The child decompresses with a running count, so an archive whose
directory lies about its sizes is stopped too.
"""

from __future__ import annotations

import csv
import io
import posixpath
import re
import zipfile
from collections.abc import Iterator
from xml.etree import ElementTree

DOCX = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"
PPTX = "application/vnd.openxmlformats-officedocument.presentationml.presentation"
EPUB = "application/epub+zip"
HTML = "text/html"
CSV = "text/csv"
ZIP = "application/zip"  # an archive not yet looked into (only at upload, never stored as a type)

CSV_ROWS_PER_SECTION = 200
SECTION_CHARS = 20_000  # a section longer than this is cut into parts of this size


class FormatRefusal(Exception):
    """A file of these formats that cannot be indexed: (kind, code, message, hint)."""

    def __init__(self, kind: str, code: str, message: str, hint: str) -> None:
        super().__init__(message)
        self.kind, self.code, self.message, self.hint = kind, code, message, hint


def _bomb(name: str, why: str) -> FormatRefusal:
    return FormatRefusal(
        "user_action_required",
        "archive_too_large",
        f"{name} is refused: {why} (a zip bomb, or an archive beyond the limits)",
        "Nothing was stored. If the file is genuine, split it, or raise "
        "SLUICE_ARCHIVE_MAX_ENTRIES / SLUICE_ARCHIVE_MAX_UNCOMPRESSED_MB.",
    )


def archive_type(path, *, name: str, max_entries: int, max_bytes: int) -> str:
    """DOCX, PPTX or EPUB, from the archive's entries; FormatRefusal for a bomb or another
    archive."""
    try:
        with zipfile.ZipFile(path) as archive:
            infos = archive.infolist()
            if len(infos) > max_entries:
                raise _bomb(
                    name, f"it holds {len(infos):,} entries, over the limit of {max_entries:,}"
                )
            total = sum(i.file_size for i in infos)
            if total > max_bytes:
                raise _bomb(name, f"it unpacks to {total:,} bytes, over the limit of {max_bytes:,}")
            names = {i.filename for i in infos}
            mimetype = archive.read("mimetype")[:64].strip() if "mimetype" in names else b""
    except zipfile.BadZipFile as exc:
        raise FormatRefusal(
            "permanent",
            "unreadable_archive",
            f"{name} is a damaged ZIP archive ({exc})",
            "Re-export the file from its source and upload it again.",
        ) from exc
    if mimetype == EPUB.encode() and "META-INF/container.xml" in names:
        return EPUB
    if "[Content_Types].xml" in names and "word/document.xml" in names:
        return DOCX
    if "[Content_Types].xml" in names and "ppt/presentation.xml" in names:
        return PPTX
    claimed = posixpath.splitext(name)[1].lower()
    said = f" although its name ends in {claimed}" if claimed else ""
    raise FormatRefusal(
        "user_action_required",
        "unsupported_type",
        f"unsupported file type: the bytes are application/zip (an archive, not a .docx, "
        f".pptx or .epub){said}",
        "Unpack the archive and upload the documents in it.",
    )


class BoundedZip:
    """A ZIP archive whose entries are decompressed with a running count against the limits."""

    def __init__(self, path, *, name: str, max_entries: int, max_bytes: int) -> None:
        self.zip = zipfile.ZipFile(path)
        self.name, self.left = name, max_bytes
        self.max_bytes = max_bytes
        if len(self.zip.infolist()) > max_entries:
            raise _bomb(
                name,
                f"it holds {len(self.zip.infolist()):,} entries, over the limit of {max_entries:,}",
            )

    def read(self, entry: str) -> bytes:
        out = io.BytesIO()
        with self.zip.open(entry) as fh:
            while block := fh.read(1 << 20):
                self.left -= len(block)
                if self.left < 0:
                    raise _bomb(self.name, f"it unpacks to more than {self.max_bytes:,} bytes")
                out.write(block)
        return out.getvalue()

    def check_all(self) -> None:
        """Decompress every entry once, counting: a directory that lies about sizes is caught
        here."""
        for info in self.zip.infolist():
            if not info.is_dir():
                self.read(info.filename)
        self.left = self.max_bytes

    def close(self) -> None:
        self.zip.close()


def _cut(label: str, text: str) -> Iterator[tuple[str, str]]:
    if len(text) <= SECTION_CHARS:
        yield label, text
        return
    for part, start in enumerate(range(0, len(text), SECTION_CHARS), start=1):
        yield f"{label}, part {part}", text[start : start + SECTION_CHARS]


# --- HTML and EPUB --------------------------------------------------------------------------------

_HIDDEN = "script,style,noscript,template,iframe,object,embed,svg,canvas,head"
_BLOCKS = (
    "p,div,li,tr,br,h1,h2,h3,h4,h5,h6,section,article,td,th,pre,blockquote,table,ul,ol,dt,dd,"
    "figcaption,header,footer,nav,aside,main,hr"
)
_MARK = "\x1e"  # before each heading: where a new section starts


_INVISIBLE = re.compile(r"(?:^|;)\s*(?:display\s*:\s*none|visibility\s*:\s*hidden)\b", re.I)


def _drop_invisible(tree) -> None:
    """Remove what a reader of the page cannot see, with everything inside it: the hidden
    attribute (but not hidden="until-found", which a reader can find), aria-hidden="true",
    an inline display:none or visibility:hidden. The outermost of them go: a node inside one
    already removed is never touched again."""
    chosen = []
    for node in tree.css("[hidden],[aria-hidden],[style]"):
        attrs = node.attributes
        hidden = "hidden" in attrs and (attrs.get("hidden") or "").lower() != "until-found"
        aria = (attrs.get("aria-hidden") or "").strip().lower() == "true"
        if hidden or aria or _INVISIBLE.search(attrs.get("style") or ""):
            chosen.append(node)
    ids = {node.mem_id for node in chosen}
    for node in chosen:
        parent, inside = node.parent, False
        while parent is not None and not inside:
            inside, parent = parent.mem_id in ids, parent.parent
        if not inside:
            node.decompose()


MAX_DEPTH = 512  # elements open inside each other; browsers' parsers stop nesting there too
_VOID = frozenset(
    "area base br col embed hr img input link meta param source track wbr keygen frame".split()
)
_AUTO_CLOSED = frozenset(  # an end tag may be left out: a sibling closes it, never nests
    "p li td th tr dt dd option optgroup thead tbody tfoot colgroup caption rb rt rtc rp "
    "html head body".split()
)
_RAW_TEXT = frozenset("script style textarea title xmp noembed noframes plaintext".split())
_TAG = re.compile(r"<(?:(!--)|(/?)([A-Za-z][A-Za-z0-9:-]*))")  # in HTML, <div/> opens a div
_RAW_END = {name: re.compile(f"</{name}", re.I) for name in _RAW_TEXT}


def _too_deep(name: str) -> FormatRefusal:
    return FormatRefusal(
        "user_action_required",
        "html_too_deep",
        f"{name} nests elements more than {MAX_DEPTH} deep (a page no reader can use, or a file "
        "built to make the parser slow)",
        "Nothing was indexed. Save the page again from its editor or browser (or as plain text) "
        "and upload that.",
    )


def nesting_depth(text: str, limit: int = MAX_DEPTH) -> int:
    """How deep elements open inside each other, counted on the tags before any parsing (the
    parser's time grows with the depth times the tags); stops counting once past ``limit``.
    Linear: comments and raw text (scripts, styles) are skipped whole, each with one search."""
    depth = deepest = skip_to = 0
    for tag in _TAG.finditer(text):
        if tag.start() < skip_to:
            continue
        comment, closing, name = tag.groups()
        if comment:
            end = text.find("-->", tag.end())
            skip_to = len(text) if end < 0 else end + 3
            continue
        name = name.lower()
        if name in _VOID or name in _AUTO_CLOSED:
            continue
        if closing:
            depth -= depth > 0
            continue
        depth += 1
        if depth > deepest:
            deepest = depth
            if deepest > limit:
                break
        if name in _RAW_END:
            closed = _RAW_END[name].search(text, tag.end())
            skip_to = len(text) if closed is None else closed.start()
    return deepest


def html_sections(
    data: bytes | str, *, prefix: str = "", name: str = "the page"
) -> list[tuple[str, str]]:
    """Visible text of an HTML page in sections that start at its h1-h3 headings; scripts, styles
    and hidden elements (``_drop_invisible``) are removed before any text is taken (nothing is
    ever executed). A page nested deeper than ``MAX_DEPTH`` is refused before it is parsed."""
    from selectolax.lexbor import LexborHTMLParser

    text = data if isinstance(data, str) else data.decode("utf-8", "replace")
    if nesting_depth(text) > MAX_DEPTH:
        raise _too_deep(name)
    tree = LexborHTMLParser(text)
    for node in tree.css(_HIDDEN):
        node.decompose()
    _drop_invisible(tree)
    for node in tree.css(_BLOCKS):
        node.insert_before("\n")
    for node in tree.css("h1,h2,h3"):
        node.insert_before(_MARK)
    root = tree.body or tree.root
    text = root.text(separator="") if root is not None else ""
    sections: list[tuple[str, str]] = []
    for part in text.split(_MARK):
        part = re.sub(r"[ \t\r\f\v]+", " ", part)
        part = re.sub(r"\n\s*\n+", "\n\n", part).strip()
        if not part:
            continue
        heading = part.split("\n", 1)[0].strip()[:60]
        label = f"{prefix}section {len(sections) + 1}" + (f": {heading}" if heading else "")
        sections.extend(_cut(label, part))
    return sections


_OPF = "{http://www.idpf.org/2007/opf}"
_CONTAINER = "{urn:oasis:names:tc:opendocument:xmlns:container}"


def epub_sections(book: BoundedZip) -> list[tuple[str, str]]:
    """The chapters of an EPUB in reading order (its spine), each in sections at its headings."""
    container = ElementTree.fromstring(book.read("META-INF/container.xml"))
    rootfile = container.find(f".//{_CONTAINER}rootfile")
    if rootfile is None:
        raise FormatRefusal(
            "permanent",
            "unreadable_epub",
            f"{book.name} has no package document",
            "Re-export the book from its source and upload it again.",
        )
    opf_path = rootfile.get("full-path", "")
    opf = ElementTree.fromstring(book.read(opf_path))
    base = posixpath.dirname(opf_path)
    manifest = {item.get("id"): item.get("href") for item in opf.iter(f"{_OPF}item")}
    sections: list[tuple[str, str]] = []
    for number, ref in enumerate(opf.iter(f"{_OPF}itemref"), start=1):
        href = manifest.get(ref.get("idref"))
        if not href:
            continue
        entry = posixpath.normpath(posixpath.join(base, href.split("#")[0]))
        try:
            data = book.read(entry)
        except KeyError:
            continue
        sections.extend(
            html_sections(data, prefix=f"chapter {number}, ", name=f"{book.name} ({entry})")
        )
    return sections


# --- Word and PowerPoint --------------------------------------------------------------------------


def docx_sections(path) -> list[tuple[str, str]]:
    """Paragraphs and tables in document order, in sections that start at each Heading paragraph."""
    import docx
    from docx.table import Table
    from docx.text.paragraph import Paragraph

    document = docx.Document(path)
    sections: list[tuple[str, list[str]]] = [("", [])]
    for block in document.iter_inner_content():
        if isinstance(block, Paragraph):
            text = block.text.strip()
            style = (block.style.name if block.style is not None else "") or ""
            if text and (style.startswith("Heading") or style == "Title"):
                sections.append((text[:60], [text]))
            elif text:
                sections[-1][1].append(text)
        elif isinstance(block, Table):
            for row in block.rows:
                cells = [c.text.strip() for c in row.cells]
                if any(cells):
                    sections[-1][1].append(" | ".join(cells))
    out: list[tuple[str, str]] = []
    for heading, lines in sections:
        if lines:
            label = f"section {len(out) + 1}" + (f": {heading}" if heading else "")
            out.extend(_cut(label, "\n".join(lines)))
    return out


def pptx_sections(path) -> list[tuple[str, str]]:
    """One section per slide: its text frames, tables and speaker notes."""
    import pptx

    deck = pptx.Presentation(path)
    out: list[tuple[str, str]] = []
    for number, slide in enumerate(deck.slides, start=1):
        lines: list[str] = []
        for shape in slide.shapes:
            if shape.has_text_frame and shape.text_frame.text.strip():
                lines.append(shape.text_frame.text.strip())
            if getattr(shape, "has_table", False) and shape.has_table:
                for row in shape.table.rows:
                    lines.append(" | ".join(c.text.strip() for c in row.cells))
        if slide.has_notes_slide and slide.notes_slide.notes_text_frame is not None:
            notes = slide.notes_slide.notes_text_frame.text.strip()
            if notes:
                lines.append(notes)
        out.extend(_cut(f"slide {number}", "\n".join(lines)))
    return out


# --- CSV ------------------------------------------------------------------------------------------


def looks_like_csv(text: str) -> bool:
    """Rows with the same number (two or more) of fields, by a delimiter the sniffer finds."""
    lines = [line for line in text[:20_000].splitlines() if line.strip()][:50]
    if len(lines) < 2:
        return False
    try:
        dialect = csv.Sniffer().sniff("\n".join(lines), delimiters=",;\t|")
    except csv.Error:
        return False
    widths = {len(row) for row in csv.reader(lines[:-1] if len(lines) > 2 else lines, dialect)}
    return len(widths) == 1 and widths.pop() >= 2


def csv_sections(text: str) -> list[tuple[str, str]]:
    """Rows as "column: value" lines, in sections of CSV_ROWS_PER_SECTION rows labelled by row range
    (row 1 is the header)."""
    sample = "\n".join(text[:20_000].splitlines()[:50])
    try:
        dialect = csv.Sniffer().sniff(sample, delimiters=",;\t|")
    except csv.Error:
        dialect = csv.excel
    rows = csv.reader(io.StringIO(text), dialect)
    header = next(rows, [])
    out: list[tuple[str, str]] = []
    lines: list[str] = []
    first = 2
    for number, row in enumerate(rows, start=2):
        cells = [
            f"{h.strip() or f'column {i + 1}'}: {v.strip()}"
            for i, (h, v) in enumerate(
                zip(header + [""] * (len(row) - len(header)), row, strict=False)
            )
            if v.strip()
        ]
        lines.append("; ".join(cells))
        if len(lines) == CSV_ROWS_PER_SECTION:
            out.append((f"rows {first}-{number}", "\n".join(lines)))
            lines, first = [], number + 1
    if lines:
        out.append((f"rows {first}-{first + len(lines) - 1}", "\n".join(lines)))
    return out
