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

from sluice.pipeline.running.chunk import (
    Outline,
    heading_line,
    parse_heading,
    strip_marks,
    table_lines,
)

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
    """A section in parts of at most SECTION_CHARS, cut between lines where it can; a part that
    starts inside a table starts with the table's header row."""
    if len(text) <= SECTION_CHARS:
        yield label, text
        return
    parts: list[list[str]] = [[]]
    used = 0
    header: list[str] = []
    lines = text.split("\n")
    for i, line in enumerate(lines):
        if not _is_row(line):
            header = []
        elif not header and i + 1 < len(lines) and _is_rule(lines[i + 1]):
            header = [line, lines[i + 1]]
        for piece in [line[k : k + SECTION_CHARS] for k in range(0, len(line), SECTION_CHARS)] or [
            ""
        ]:
            if parts[-1] and used + len(piece) + 1 > SECTION_CHARS:
                carried = header if header and piece not in header else []
                parts.append(list(carried))
                used = sum(len(h) + 1 for h in carried)
            parts[-1].append(piece)
            used += len(piece) + 1
    for number, part in enumerate(parts, start=1):
        yield f"{label}, part {number}", "\n".join(part)


def _is_row(line: str) -> bool:
    return len(line) > 2 and line.startswith("|") and line.endswith("|")


def _is_rule(line: str) -> bool:
    return _is_row(line) and set(line) <= set("|-: ")


def _with_paths(
    sections: list[tuple[str, str]], outline: Outline | None = None
) -> list[tuple[str, str]]:
    """Each section's text opened by the heading lines in force where it starts (those it does
    not open with itself), so its first chunk knows its place in the document too."""
    outline = outline if outline is not None else Outline()
    out = []
    for label, text in sections:
        start = outline.lines()
        outline.follow(text)
        out.append((label, "\n".join(start + [text]) if start else text))
    return out


def _heading_label(prefix: str, number: int, first_line: str) -> str:
    heading = parse_heading(first_line)
    text = (heading[1] if heading else first_line.strip())[:60]
    return f"{prefix}section {number}" + (f": {text}" if text else "")


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
    data: bytes | str, *, prefix: str = "", name: str = "the page", title: str | None = None
) -> list[tuple[str, str]]:
    """Visible text of an HTML page in sections that start at its h1-h3 headings; scripts, styles
    and hidden elements (``_drop_invisible``) are removed before any text is taken (nothing is
    ever executed). A page nested deeper than ``MAX_DEPTH`` is refused before it is parsed.
    Tables are Markdown rows, h1-h6 heading lines, and the page's <title> (or ``title``; "" for
    none) the document's title; each section starts with the heading path in force."""
    found, sections = _html_parts(data, prefix=prefix, name=name)
    outline = Outline()
    if found if title is None else title:
        outline.enter(0, found if title is None else title)
    return _with_paths(sections, outline)


def _html_parts(data: bytes | str, *, prefix: str, name: str) -> tuple[str, list[tuple[str, str]]]:
    """The page's <title> and its sections, without the heading paths (``html_sections``)."""
    from selectolax.lexbor import LexborHTMLParser

    text = data if isinstance(data, str) else data.decode("utf-8", "replace")
    if nesting_depth(text) > MAX_DEPTH:
        raise _too_deep(name)
    tree = LexborHTMLParser(strip_marks(text))
    node = tree.css_first("title")
    title = " ".join(node.text().split()) if node is not None else ""
    for node in tree.css(_HIDDEN):
        node.decompose()
    _drop_invisible(tree)
    _html_tables(tree)
    for node in tree.css(_BLOCKS):
        node.insert_before("\n")
    for level in range(1, 7):
        for node in tree.css(f"h{level}"):
            if level <= 3:
                node.insert_before(_MARK)
            node.insert_before(f"{_HEADING}{'#' * level} ")
            node.insert_after("\n")
    root = tree.body or tree.root
    text = root.text(separator="") if root is not None else ""
    sections: list[tuple[str, str]] = []
    heads = ""  # a part of headings alone opens the next part
    for part in text.split(_MARK):
        part = re.sub(r"[ \t\r\f\v]+", " ", part)
        part = re.sub(r"\n\s*\n+", "\n\n", part).strip()
        part = "\n".join(_heading_fixed(line) for line in part.split("\n"))
        if not part:
            continue
        part = f"{heads}\n{part}" if heads else part
        if all(parse_heading(line) for line in part.split("\n") if line.strip()):
            heads = part
            continue
        heads = ""
        label = _heading_label(prefix, len(sections) + 1, part.split("\n", 1)[0])
        sections.extend(_cut(label, part))
    if heads:
        label = _heading_label(prefix, len(sections) + 1, heads.split("\n", 1)[0])
        sections.append((label, heads))
    return title, sections


_HEADING = heading_line(0, "")[0]  # the mark a heading line starts with


def _heading_fixed(line: str) -> str:
    """A heading line as the chunker makes them (its words on one line, cut to length)."""
    heading = parse_heading(line)
    return line if heading is None else heading_line(*heading)


def _html_tables(tree) -> None:
    """Every table replaced by its Markdown rows (inner tables first: an outer cell holds an inner
    table's rows as its text)."""
    for table in reversed(tree.css("table")):
        rows = [
            [" ".join(cell.text(separator=" ").split()) for cell in row.css("th,td")]
            for row in table.css("tr")
        ]
        rows = [row for row in rows if any(row)]
        if rows:
            table.replace_with("\n" + "\n".join(table_lines(rows)) + "\n")
        else:
            table.decompose()


_OPF = "{http://www.idpf.org/2007/opf}"
_CONTAINER = "{urn:oasis:names:tc:opendocument:xmlns:container}"
_DC = "{http://purl.org/dc/elements/1.1/}"


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
    outline = Outline()
    titles = [" ".join((t.text or "").split()) for t in opf.iter(f"{_DC}title")]
    if titles and titles[0]:  # the book's title heads every chapter's path
        outline.enter(0, titles[0])
    for number, ref in enumerate(opf.iter(f"{_OPF}itemref"), start=1):
        href = manifest.get(ref.get("idref"))
        if not href:
            continue
        entry = posixpath.normpath(posixpath.join(base, href.split("#")[0]))
        try:
            data = book.read(entry)
        except KeyError:
            continue
        _, chapter = _html_parts(data, prefix=f"chapter {number}, ", name=f"{book.name} ({entry})")
        sections.extend(_with_paths(chapter, outline))
    return sections


# --- Word and PowerPoint --------------------------------------------------------------------------


def docx_sections(path) -> list[tuple[str, str]]:
    """Paragraphs and tables (as Markdown rows) in document order, in sections that start at each
    Title or Heading paragraph (a heading line of its level); the file's title property, when
    it has one and no Title paragraph, is the document's title."""
    import docx
    from docx.table import Table
    from docx.text.paragraph import Paragraph

    document = docx.Document(path)
    sections: list[tuple[str, list[str]]] = [("", [])]
    titled = False
    for block in document.iter_inner_content():
        if isinstance(block, Paragraph):
            text = strip_marks(block.text).strip()
            level = _docx_level((block.style.name if block.style is not None else "") or "")
            if text and level is not None:
                titled = titled or level == 0
                if sections[-1][1] and all(parse_heading(ln) for ln in sections[-1][1]):
                    sections[-1][1].append(heading_line(level, text))  # headings alone: one part
                else:
                    sections.append((text[:60], [heading_line(level, text)]))
            elif text:
                sections[-1][1].append(text)
        elif isinstance(block, Table):
            rows = [[strip_marks(c.text) for c in row.cells] for row in block.rows]
            sections[-1][1].extend(table_lines([r for r in rows if any(c.strip() for c in r)]))
    title = " ".join(strip_marks(document.core_properties.title or "").split())
    if title and not titled:
        sections[0][1].insert(0, heading_line(0, title))
    out: list[tuple[str, str]] = []
    for heading, lines in sections:
        if lines:
            label = f"section {len(out) + 1}" + (f": {heading}" if heading else "")
            out.extend(_cut(label, "\n".join(lines)))
    return _with_paths(out)


def _docx_level(style: str) -> int | None:
    """The heading level of a paragraph style: Title 0, Heading N its N; None for body text."""
    if style == "Title":
        return 0
    if not style.startswith("Heading"):
        return None
    digits = "".join(ch for ch in style if ch.isdigit())
    return int(digits) if digits else 1


def pptx_sections(path) -> list[tuple[str, str]]:
    """One section per slide: its title (a heading line, under the deck's title when it has one),
    its text frames, tables (as Markdown rows) and speaker notes."""
    import pptx

    deck = pptx.Presentation(path)
    title = " ".join(strip_marks(deck.core_properties.title or "").split())
    out: list[tuple[str, str]] = []
    for number, slide in enumerate(deck.slides, start=1):
        lines: list[str] = []
        heading = slide.shapes.title
        if heading is not None and heading.has_text_frame and heading.text_frame.text.strip():
            lines.append(heading_line(1, strip_marks(heading.text_frame.text)))
        for shape in slide.shapes:
            if heading is not None and shape.shape_id == heading.shape_id:
                continue
            if shape.has_text_frame and shape.text_frame.text.strip():
                lines.append(strip_marks(shape.text_frame.text).strip())
            if getattr(shape, "has_table", False) and shape.has_table:
                rows = [[strip_marks(c.text) for c in row.cells] for row in shape.table.rows]
                lines.extend(table_lines([r for r in rows if any(c.strip() for c in r)]))
        if slide.has_notes_slide and slide.notes_slide.notes_text_frame is not None:
            notes = strip_marks(slide.notes_slide.notes_text_frame.text).strip()
            if notes:
                lines.append(notes)
        if title and lines:  # the deck's title heads every slide's path
            lines.insert(0, heading_line(0, title))
        out.extend(_with_paths(list(_cut(f"slide {number}", "\n".join(lines)))))
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
    """Rows as Markdown table rows under the header row (row 1), in sections of
    CSV_ROWS_PER_SECTION rows labelled by row range; every section, and so every chunk, repeats
    the header row."""
    sample = "\n".join(text[:20_000].splitlines()[:50])
    try:
        dialect = csv.Sniffer().sniff(sample, delimiters=",;\t|")
    except csv.Error:
        dialect = csv.excel
    rows = csv.reader(io.StringIO(strip_marks(text)), dialect)
    header = [h.strip() for h in next(rows, [])]
    out: list[tuple[str, str]] = []
    taken: list[list[str]] = []
    first = 2

    def close(last: int) -> None:
        width = max(len(header), *(len(r) for r in taken))
        names = [(header[i] if i < len(header) else "") or f"column {i + 1}" for i in range(width)]
        out.append((f"rows {first}-{last}", "\n".join(table_lines([names] + taken))))

    last = 1
    for number, row in enumerate(rows, start=2):
        last = number
        if any(v.strip() for v in row):
            taken.append([v.strip() for v in row])
        if number - first + 1 == CSV_ROWS_PER_SECTION:
            if taken:
                close(number)
            taken, first = [], number + 1
    if taken:
        close(last)
    return out
