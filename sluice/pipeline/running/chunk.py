"""Deterministic chunking that follows the document's structure; every chunk records its page.

The same text and settings always give the same chunks in the same order, so chunk ids derived
from position are stable across runs. Chunks never span pages.

The parsers hand over structure inside the page text itself, so every caller of ``split_text``
(the runner, the previews) chunks it alike:

- a heading is a line ``HEADING + "#" * level + " " + text`` (level 0: the document's title).
  ``HEADING`` is a Unicode noncharacter, which the parsers remove from the text they read
  (``strip_marks``), so only a parser can make one. A page starts with the headings in force
  where it starts (``Outline``), so its first chunk knows its section too;
- a table is a run of Markdown rows (``| a | b |``), the header row first, then ``| --- |``.

A chunk ends at every heading (it never spans two sections) and begins with its heading path,
``Title > Section > Subsection``: the context that is embedded and indexed with it. Two blank
lines (``PATH_END``, which the normalised text of a chunk never holds) end the path, so a hit can
show it apart from the text (``heading_of``). A table is cut only between rows, and every chunk
of a table repeats its header row.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

# v3: tables as Markdown rows, headings as each chunk's path, columns read in order. Parsing and
# chunking change together: a new parse output is a new version, so every chunk id changes with it
# and a reindex rebuilds the documents of an older one. v4: PDF tables keep the header above
# cells of two lines, the columns under a header of groups and those of cells set tight, and the
# space between spans joined into a cell.
CHUNKER_VERSION = "structured-v4"
SEPARATORS = ("\n\n", "\n", ". ", "? ", "! ", "; ", ", ", " ")

HEADING = "\ufdd0"  # starts a heading line of parsed text; never in text read from a file
PATH_SEPARATOR = " > "
PATH_END = "\n\n\n"  # between a chunk's heading path and its text
_MARKS = {cp: None for cp in range(0xFDD0, 0xFDF0)}  # the noncharacters U+FDD0..U+FDEF
_MARKED = re.compile("[\ufdd0-\ufdef]")  # a search, not max(): every line of a PDF is checked
MAX_HEADING_CHARS = 200  # a heading longer than this is cut: a path is context, not content
ROW_LIMIT = 4  # a table row longer than this many chunk sizes is split as text (the only cut)

_SPACES = re.compile(r"[ \t\u00a0]+")
_BLANKS = re.compile(r"\n\s*\n+")
_RULE = re.compile(r"^\|(?:\s*:?-{3,}:?\s*\|)+$")
# A text whose only words are a page number: "7", "- 7 -", "Page 7", "7 / 12", "vii".
PAGE_NUMBER = re.compile(
    r"^\W*(?:(?:page|p\.|seite|pagina|página|стр\.?)\s*)?(?:\d{1,5}|[ivxlcdm]{1,7})"
    r"(?:\s*(?:of|/|de|von|из)\s*(?:\d{1,5}|[ivxlcdm]{1,7}))?\W*$",
    re.IGNORECASE,
)
MIN_MEANINGFUL = (
    3  # letters or digits a text needs to be worth a chunk (one CJK character is a word)
)


def meaningful(text: str) -> bool:
    """True when a text holds something worth indexing: more than a page number or punctuation.
    A one-character chunk matches unrelated searches; it is never made."""
    found = 0
    for ch in text:  # counted up to MIN_MEANINGFUL only: a page is read through for this twice
        if ch.isalnum():
            found += 1
            if found == MIN_MEANINGFUL:
                return not PAGE_NUMBER.match(text.strip())
    return False


@dataclass(frozen=True)
class Chunk:
    position: int
    page: int
    text: str
    source_sha: str | None = None  # set when the text is an edit of this sha's (chunk_edits)


def strip_marks(text: str) -> str:
    """``text`` without the noncharacters the parsers use as marks (a file's own are dropped)."""
    return text.translate(_MARKS) if _MARKED.search(text) else text


def heading_line(level: int, text: str) -> str:
    """The line that marks a heading of ``level`` (0: the document's title) in parsed text."""
    return f"{HEADING}{'#' * max(0, level)} {' '.join(text.split())[:MAX_HEADING_CHARS]}"


def parse_heading(line: str) -> tuple[int, str] | None:
    """(level, text) of a heading line, or None for any other line."""
    if not line.startswith(HEADING):
        return None
    body = line[1:]
    marks = len(body) - len(body.lstrip("#"))
    return marks, body[marks:].strip()


def table_lines(rows: list[list[str]]) -> list[str]:
    """Rows of cells as Markdown table lines: the first row is the header, then the rule."""
    width = max((len(r) for r in rows), default=0)
    if not rows or width == 0:
        return []

    def line(cells: list[str]) -> str:
        cells = [_cell(c) for c in cells] + [""] * (width - len(cells))
        return "| " + " | ".join(cells) + " |"

    return [line(rows[0]), "|" + " --- |" * width] + [line(r) for r in rows[1:]]


def _cell(text: str | None) -> str:
    return " ".join((text or "").split()).replace("|", "\\|")


@dataclass
class Outline:
    """The headings in force while a document is read: each new heading closes those of its level
    and below. ``lines()`` are the heading lines a page starts with to carry its section."""

    path: list[tuple[int, str]] = field(default_factory=list)

    def enter(self, level: int, text: str) -> None:
        while self.path and self.path[-1][0] >= level:
            self.path.pop()
        self.path.append((level, text))

    def follow(self, text: str) -> None:
        """Take in every heading line of ``text``, in order."""
        if HEADING in text:
            for line in text.split("\n"):
                heading = parse_heading(line)
                if heading is not None:
                    self.enter(*heading)

    def lines(self) -> list[str]:
        return [heading_line(level, text) for level, text in self.path]

    def prefix(self) -> str:
        return PATH_SEPARATOR.join(text for _, text in self.path if text)


def normalise(text: str) -> str:
    text = _SPACES.sub(" ", text)
    text = _BLANKS.sub("\n\n", text)
    return "\n".join(line.strip() for line in text.split("\n")).strip()


def _windows(text: str, *, size: int, overlap: int) -> list[str]:
    """Split normalised text at the strongest separator in the second half of each window, with
    overlap."""
    chunks: list[str] = []
    n = len(text)
    start = 0
    while start < n:
        end = min(start + size, n)
        if end < n:
            floor = start + size // 2
            for sep in SEPARATORS:
                cut = text.rfind(sep, floor, end)
                if cut != -1:
                    end = cut + len(sep)
                    break
        piece = text[start:end].strip()
        if piece and meaningful(piece):
            chunks.append(piece)
        if end >= n:
            break
        nxt = max(start + 1, end - overlap)
        if overlap:
            space = text.find(" ", nxt, end)  # start the overlap at a word boundary
            if space != -1:
                nxt = space + 1
        start = nxt
    return chunks


def _is_row(line: str) -> bool:
    return len(line) > 2 and line.startswith("|") and line.endswith("|")


@dataclass
class _Section:
    prefix: str
    blocks: list[tuple[str, list[str]]] = field(default_factory=list)  # ("text"|"table", lines)

    def add(self, line: str) -> None:
        kind = "table" if _is_row(line) else "text"
        if self.blocks and self.blocks[-1][0] == kind:
            self.blocks[-1][1].append(line)
        else:
            self.blocks.append((kind, [line]))


def _sections(text: str, outline: Outline) -> Iterator[_Section]:
    """The page's text between its headings, each part with the heading path in force."""
    section = _Section(outline.prefix())
    for line in text.split("\n"):
        heading = parse_heading(line)
        if heading is None:
            section.add(line)
            continue
        if section.blocks:
            yield section
        outline.enter(*heading)
        section = _Section(outline.prefix())
    if section.blocks:
        yield section


def _table_chunks(lines: list[str], budget: int, lead: str) -> list[str]:
    """A table cut between rows into pieces of at most ``budget`` characters (a row longer than
    that is a piece of its own), each with the header row; ``lead`` (the text just before the
    table) opens the first."""
    header = lines[:2] if len(lines) > 1 and _RULE.match(lines[1]) else []
    rows = lines[len(header) :]
    if not rows:  # a header alone is a row of its own
        header, rows = [], lines[:1]
    fixed = sum(len(h) + 1 for h in header)
    pieces: list[str] = []
    taken: list[str] = []
    opener = lead
    used = fixed + (len(lead) + 1 if lead else 0)

    def flush() -> None:
        nonlocal taken, opener, used
        if taken and meaningful("\n".join(taken)):
            pieces.append("\n".join(([opener] if opener else []) + header + taken))
        elif opener:
            pieces.append(opener)
        taken, opener, used = [], "", fixed

    for row in rows:
        if len(row) > ROW_LIMIT * budget:  # a runaway row: cut as text, the one cut in a row
            flush()
            pieces.extend(_windows(row, size=budget, overlap=0))
            continue
        if taken and used + len(row) > budget:
            flush()
        taken.append(row)
        used += len(row) + 1
    flush()
    return pieces


def _section_chunks(section: _Section, size: int, overlap: int) -> list[str]:
    prefix = _fit_prefix(section.prefix, size)
    budget = max(size // 2, size - len(prefix) - len(PATH_END)) if prefix else size
    bodies: list[str] = []
    lead = ""
    for i, (kind, lines) in enumerate(section.blocks):
        if kind == "text":
            pieces = _windows(normalise("\n".join(lines)), size=budget, overlap=overlap)
            following = i + 1 < len(section.blocks)
            if following and pieces and len(pieces[-1]) < budget // 2:
                lead = pieces.pop()  # the words that introduce the table go with its first rows
            bodies.extend(pieces)
        else:
            rows = [_SPACES.sub(" ", line.strip()) for line in lines]
            first = _table_chunks(rows, budget, lead)
            if lead and first and len(first[0]) > budget:  # the lead does not fit: on its own
                bodies.append(lead)
                first = _table_chunks(rows, budget, "")
            bodies.extend(first)
            lead = ""
    if lead:
        bodies.append(lead)
    return [f"{prefix}{PATH_END}{body}" if prefix else body for body in bodies]


def _fit_prefix(prefix: str, size: int) -> str:
    """The heading path, its outer headings left out (and the rest cut) past a third of a chunk."""
    limit = max(20, size // 3)
    if len(prefix) <= limit:
        return prefix
    parts = prefix.split(PATH_SEPARATOR)
    while len(parts) > 1 and len(PATH_SEPARATOR.join(parts)) + 4 > limit:
        parts.pop(0)
    return ("…" + PATH_SEPARATOR + PATH_SEPARATOR.join(parts))[:limit]


def split_text(text: str, *, size: int, overlap: int) -> list[str]:
    """The chunks of one page: at most ``size`` characters of text each (the strongest separator
    in the second half of each window, with ``overlap``), ended at every heading and opened by the
    heading path; tables cut only between rows, each piece with its header row. A page whose only
    text is headings makes one chunk of its path."""
    if HEADING not in text and "|" not in text:  # plain text: the windows alone
        text = normalise(text)
        return _windows(text, size=size, overlap=overlap) if text else []
    outline = Outline()
    chunks: list[str] = []
    for section in _sections(text, outline):
        chunks.extend(_section_chunks(section, size, overlap))
    if not chunks and meaningful(outline.prefix()):
        chunks.append(_fit_prefix(outline.prefix(), size))
    return chunks


def heading_of(text: str) -> tuple[str, str]:
    """(heading path, text) of a chunk; the path is "" for a chunk made without one."""
    path, end, body = text.partition(PATH_END)
    if not end or "\n" in path:
        return "", text
    return path, body


def chunk_pages(pages: Iterable[tuple[int, str]], *, size: int, overlap: int) -> Iterator[Chunk]:
    """Chunks of a stream of (page, text), numbered in order."""
    position = 0
    for page, text in pages:
        for piece in split_text(text, size=size, overlap=overlap):
            yield Chunk(position, page, piece)
            position += 1
