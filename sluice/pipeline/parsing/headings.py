"""Headings of a PDF: from its outline (bookmarks) where it has one, else from the type.

With an outline, each entry is found among the lines of its page (the same letters and digits,
numbering aside) and marked at its level; an entry not found on its page is placed where its
destination points, or at the page's top. The largest heading above the first entry of the first
page is the document's title. Without an outline, a short run of lines (three at most, of one
block) set larger than the body text is a heading: the title and sections at 1.6 times the body
size or more, subsections at 1.3, minor heads at 1.1, and a lone bold line at body size below
those. The body size is the size most characters of the document so far are set in.

Only what the lines already hold is read (sizes and bold flags of their spans): nothing more is
extracted from the page. Marked headings are lines ``HEADING + "#" * level + " " + text``
(sluice.pipeline.running.chunk), and ``Outline`` carries the path in force from page to page.
Markdown files have their ``#`` headings marked the same way (``markdown_headings``).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from operator import attrgetter

from sluice.pipeline.parsing.reading import Line
from sluice.pipeline.running.chunk import HEADING, Outline, heading_line, meaningful

LEVELS = ((1.6, 1), (1.3, 2), (1.1, 3))  # (size over body size, level)
BOLD_LEVEL = 4
TITLE_RATIO = 1.5  # a title is set at least this much larger than the body
MAX_LINES = 3
MAX_CHARS = 150
MAX_BOLD_CHARS = 80
SETTLED = 200  # characters seen before the document's body size is trusted
FALLBACK_BODY = 11.0  # body size assumed on a first page with hardly any text


_NOT_ALNUM = re.compile(r"[\W_]+")  # \w is what str.isalnum() accepts, and "_"


def _key(text: str) -> str:
    """Letters and digits, case folded, leading numbering dropped: "2.1 Results" -> "results"."""
    key = _NOT_ALNUM.sub("", text.casefold())
    return key.lstrip("0123456789ivx") or key


@dataclass
class PdfHeadings:
    """What the pages read so far say about headings: the outline, the body size, the path."""

    entries: dict[int, list[tuple[int, str, float | None]]] = field(default_factory=dict)
    sizes: Counter = field(default_factory=Counter)
    outline: Outline = field(default_factory=Outline)
    title_size: float = 0.0

    @classmethod
    def of(cls, doc) -> PdfHeadings:
        """The headings of ``doc``, with its outline when it has one (a broken one counts as
        none)."""
        found = cls()
        try:
            toc = doc.get_toc(simple=False)
        except Exception as exc:
            if isinstance(exc, MemoryError):
                raise
            toc = []
        for entry in toc:
            level, title, page = int(entry[0]), " ".join(str(entry[1]).split()), int(entry[2])
            dest = entry[3] if len(entry) > 3 and isinstance(entry[3], dict) else {}
            to = dest.get("to")
            y = float(to.y) if to is not None and dest.get("kind") == 1 else None
            if title and page >= 1:
                found.entries.setdefault(page, []).append((level, title, y))
        return found

    def start(self) -> str:
        """The heading lines a page starts with: the path in force where it starts."""
        return "\n".join(self.outline.lines())

    def mark(self, number: int, lines: list[Line], height: float) -> list[Line]:
        """``lines`` of page ``number`` with each heading's lines made one marked line."""
        horizontal = [ln for ln in lines if ln.horizontal and ln.size > 0]
        sizes: dict[float, int] = {}  # counted here, then added: a Counter's += is dearer
        for ln in horizontal:
            size = round(ln.size * 2) / 2
            sizes[size] = sizes.get(size, 0) + len(ln.text)
        self.sizes.update(sizes)
        runs = _runs(horizontal)
        if self.entries:
            marked = self._from_outline(number, runs, lines, height)
        else:
            marked = self._from_type(number, runs)
        if not marked:
            return lines
        gone = {ln.order for run, _ in marked for ln in run[1:]}
        out = [ln for ln in lines if ln.order not in gone]
        for run, level in marked:
            head = run[0]
            text = " ".join(" ".join(ln.text.split()) for ln in run)
            head.x1, head.y1 = max(ln.x1 for ln in run), max(ln.y1 for ln in run)
            head.text = heading_line(level, text)
        return out

    def body_size(self) -> float:
        if not self.sizes:
            return FALLBACK_BODY
        size = self.sizes.most_common(1)[0][0]
        if sum(self.sizes.values()) < SETTLED:
            return min(size, FALLBACK_BODY)
        return size

    def _from_type(self, number: int, runs: list[list[Line]]) -> list[tuple[list[Line], int]]:
        body = self.body_size()
        marked: list[tuple[list[Line], int]] = []
        for i, run in enumerate(runs):
            level = _level(run, body)
            if level is None:
                continue
            if level == BOLD_LEVEL and i and runs[i - 1][0].block == run[0].block:
                continue  # a bold line inside a paragraph, not above it
            size = run[0].size
            if not self.title_size and number == 1 and size >= TITLE_RATIO * body:
                largest = max(r[0].size for r in runs)
                if size >= largest:
                    self.title_size = size
            if self.title_size and size >= self.title_size - 0.25:
                level = 0
            marked.append((run, level))
        return marked

    def _from_outline(
        self, number: int, runs: list[list[Line]], lines: list[Line], height: float
    ) -> list[tuple[list[Line], int]]:
        marked: list[tuple[list[Line], int]] = []
        used: set[int] = set()
        for level, title, y in self.entries.get(number, ()):
            key = _key(title)
            longest = 3 * len(title) + 40  # a run longer than this is a paragraph, not the title
            run = next(
                (
                    r
                    for r in runs
                    if id(r) not in used
                    and sum(len(ln.text) for ln in r) <= longest
                    and _run_key(r) == key
                ),
                None,
            )
            if run is None:
                run = [_placed(lines, title, None if y is None else height - y)]
                lines.append(run[0])
            used.add(id(run))
            marked.append((run, level))
        if number == 1 and marked:
            first = min(r[0].y0 for r, _ in marked)
            body = self.body_size()
            above = [r for r in runs if id(r) not in used and r[0].y1 <= first]
            big = [r for r in above if r[0].size >= TITLE_RATIO * body and _level(r, body)]
            if big:
                marked.append((max(big, key=lambda r: r[0].size), 0))
        return marked


def _run_key(run: list[Line]) -> str:
    return _key(" ".join(ln.text for ln in run))


def _runs(lines: list[Line]) -> list[list[Line]]:
    """Consecutive lines of one block set alike (size, bold): the units a heading is made of."""
    runs: list[list[Line]] = []
    run: list[Line] = []
    last = None
    for ln in sorted(lines, key=_BLOCK_ORDER):
        if (
            last is not None
            and last.block == ln.block
            and abs(last.size - ln.size) < 0.25
            and last.bold == ln.bold
        ):
            run.append(ln)
        else:
            run = [ln]
            runs.append(run)
        last = ln
    return runs


_BLOCK_ORDER = attrgetter("block", "order")


def _level(run: list[Line], body: float) -> int | None:
    """The level of a run of lines as a heading, or None when it is not one."""
    if len(run) > MAX_LINES:
        return None
    ratio = run[0].size / max(body, 1.0)
    if ratio < LEVELS[-1][0] and not (run[0].bold and ratio >= 0.95 and len(run) == 1):
        return None  # body text: its words need no reading
    text = " ".join(" ".join(ln.text.split()) for ln in run)
    if len(text) > MAX_CHARS or not meaningful(text) or not any(ch.isalpha() for ch in text):
        return None
    for least, level in LEVELS:
        if ratio >= least:
            return level
    if (
        run[0].bold
        and ratio >= 0.95
        and len(run) == 1
        and len(text) <= MAX_BOLD_CHARS
        and (text[0].isupper() or text[0].isdigit())
        and text[-1] not in ".:;,"
    ):
        return BOLD_LEVEL
    return None


def _placed(lines: list[Line], title: str, y: float | None) -> Line:
    """A line for an outline entry not found in the text: where it points, else at the top."""
    x0 = min((ln.x0 for ln in lines), default=0.0)
    x1 = max((ln.x1 for ln in lines), default=1.0)
    top = min((ln.y0 for ln in lines), default=0.0) - 1 if y is None else y
    order = min((ln.order for ln in lines), default=0) - 1
    return Line(x0, top, x1, top + 1, title, -2, order)


_ATX = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.+?)[ \t]*#*[ \t]*$")
_FENCE = re.compile(r"^ {0,3}(```|~~~)")


def markdown_headings(text: str) -> str:
    """Markdown's ``#`` headings (outside code fences) as heading lines of their level."""
    out: list[str] = []
    fenced = False
    for line in text.split("\n"):
        if _FENCE.match(line):
            fenced = not fenced
        found = None if fenced else _ATX.match(line)
        out.append(heading_line(len(found.group(1)), found.group(2)) if found else line)
    return "\n".join(out)


def text_pages(text: str, size: int) -> list[str]:
    """Text cut into pages of ``size`` characters, each opened by the heading lines in force
    where it starts (none in text without headings)."""
    slices = [text[start : start + size] for start in range(0, len(text), size)] or [""]
    if HEADING not in text:
        return slices
    outline = Outline()
    pages = []
    for piece in slices:
        start = outline.lines()
        outline.follow(piece)
        pages.append("\n".join(start + [piece]) if start else piece)
    return pages
