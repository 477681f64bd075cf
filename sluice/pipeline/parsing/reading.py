"""Reading order of one PDF page, from the lines PyMuPDF finds (``page.get_text("dict")``).

Content-stream order is what a producer happened to write: a form generator writes both columns
row by row, a Japanese producer writes vertical text one glyph at a time. Here:

- vertical lines (writing mode 1, or a page of upright glyphs stacked one per line) are grouped
  into columns, read top to bottom, columns right to left, and each column becomes one line of
  text;
- horizontal lines are cut into columns wherever a vertical gutter runs through a region; lines
  that cross the gutter (a title, a footer, a wide figure caption) cut the region into bands read
  top to bottom, and each band's columns are read left to right (a recursive XY cut);
- a region where no gutter runs through but which holds bands apart by blank space (a full-width
  abstract above two columns) is cut into those bands first when one of them has columns;
- anything else (rotated lines) follows in the order the producer wrote it.

Only the order changes; the text of every line is kept as PyMuPDF gives it. The extraction turns
a page's tables into lines of Markdown rows (sluice.pipeline.parsing.tables) and marks its headings
(sluice.pipeline.parsing.headings) before it orders the lines here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sluice.pipeline.running.chunk import strip_marks

MIN_GUTTER = 9.0  # points of clear space between two columns
MIN_SIDE_SHARE = 0.15  # each column spans at least this share of the region's width
MIN_SIDE_LINES = 2
MAX_DEPTH = 8
MAX_LINES = 2000  # past this (a dense table or map) the producer's order is kept
MAX_SPANNERS = 4  # lines allowed across a gutter: a title, a footer, a caption
EDGE = 0.5  # points a line may overlap a gutter's edge (edges are compared rounded)


@dataclass
class Line:
    x0: float
    y0: float
    x1: float
    y1: float
    text: str
    block: int
    order: int  # position in content-stream order
    vertical: bool = False
    horizontal: bool = True
    size: float = 0.0  # the font size most of its characters are set in
    bold: bool = False  # every span of it is bold
    # (x0, x1, text) of each span, where a line has several: a table's cells may share a line
    spans: list[tuple[float, float, str]] = field(default_factory=list)


_BOLD_NAMES = ("bold", "black", "heavy", "semibold", "demi")


_BOLD_FONTS: dict[str, bool] = {}  # font name -> does it name a bold face (a page has few)


def _bold(span: dict) -> bool:
    if span.get("flags", 0) & 16:
        return True
    font = span.get("font", "")
    bold = _BOLD_FONTS.get(font)
    if bold is None:
        bold = any(n in font.lower() for n in _BOLD_NAMES)
        if len(_BOLD_FONTS) < 4096:
            _BOLD_FONTS[font] = bold
    return bold


def lines_of(page_dict: dict) -> list[Line]:
    out: list[Line] = []
    for b, block in enumerate(page_dict.get("blocks", ())):
        if block.get("type", 0) != 0:
            continue
        for line in block.get("lines", ()):
            raw = line.get("spans", ())
            if len(raw) == 1:  # most lines: one span, read once
                text = raw[0].get("text", "")
                spans = [raw[0]] if text.strip() else []
            else:
                spans = [s for s in raw if s.get("text", "").strip()]
                text = "".join(span.get("text", "") for span in raw)
            text = strip_marks(text)
            if not text.strip():
                continue
            x0, y0, x1, y1 = line["bbox"]
            dx, dy = line.get("dir", (1.0, 0.0))
            vertical = line.get("wmode", 0) == 1
            horizontal = not vertical and abs(dx) > 0.9 and dx > 0
            main = (
                spans[0]
                if len(spans) == 1
                else max(spans, key=lambda s: len(s["text"]), default=None)
            )
            out.append(
                Line(
                    x0,
                    y0,
                    x1,
                    y1,
                    text,
                    b,
                    len(out),
                    vertical,
                    horizontal,
                    float(main.get("size", 0.0)) if main else 0.0,
                    _bold(spans[0]) if len(spans) == 1 else bool(spans) and all(map(_bold, spans)),
                    [(s["bbox"][0], s["bbox"][2], strip_marks(s["text"])) for s in spans]
                    if len(spans) > 1
                    else [],
                )
            )
    return out


def page_text(page_dict: dict) -> str:
    """The page's text in reading order, as lines (no tables, no headings)."""
    return ordered_text(lines_of(page_dict))


def ordered_text(lines: list[Line]) -> str:
    """Lines in reading order: vertical columns, horizontal columns and bands, the rest."""
    singles = [ln for ln in lines if ln.horizontal and _is_cjk(ln.text.strip())]
    if len(singles) >= 8 and len(singles) > 0.6 * len(lines):
        # Vertical writing set as upright glyphs one below the other (Chromium prints
        # writing-mode: vertical-rl so): one glyph per horizontal line, stacked in columns.
        for ln in singles:
            ln.horizontal, ln.vertical = False, True
    horizontal = [ln for ln in lines if ln.horizontal]
    vertical = [ln for ln in lines if ln.vertical]
    other = [ln for ln in lines if not ln.horizontal and not ln.vertical]
    parts: list[str] = []
    vertical_text = _vertical(vertical)
    horizontal_text = _join_groups(_segment(horizontal, 0))
    if sum(len(ln.text) for ln in vertical) > sum(len(ln.text) for ln in horizontal):
        parts = [vertical_text, horizontal_text]
    else:
        parts = [horizontal_text, vertical_text]
    parts.append(_join_groups([other]))
    return "\n\n".join(p for p in parts if p)


def _is_cjk(text: str) -> bool:
    """One CJK character or full-width mark (a glyph of vertical writing set upright)."""
    return len(text) == 1 and (
        "\u3000" <= text <= "\u9fff" or "\uac00" <= text <= "\ud7af" or "\uf900" <= text <= "\uffef"
    )


def _join_groups(groups: list[list[Line]]) -> str:
    """Lines of one block on separate lines; a blank line between blocks and between groups."""
    out: list[str] = []
    for group in groups:
        previous = None
        for ln in group:
            if previous is not None and ln.block != previous:
                out.append("")
            out.append(ln.text)
            previous = ln.block
        if group:
            out.append("")
    return "\n".join(out).strip()


def _segment(lines: list[Line], depth: int) -> list[list[Line]]:
    """The lines of a region as groups in reading order."""
    if len(lines) < 2 * MIN_SIDE_LINES or len(lines) > MAX_LINES or depth > MAX_DEPTH:
        return [sorted(lines, key=lambda ln: ln.order)]
    gutter = _find_gutter(lines)
    if gutter is None:
        bands = _bands(lines)
        if len(bands) > 1 and any(
            len(band) >= 2 * MIN_SIDE_LINES and _find_gutter(band) for band in bands
        ):
            return [group for band in bands for group in _segment(band, depth + 1)]
        return [sorted(lines, key=lambda ln: ln.order)]
    g0, g1 = gutter
    groups: list[list[Line]] = []
    band: list[Line] = []

    def close_band() -> None:
        if not band:
            return
        left = [ln for ln in band if ln.x1 <= g0 + EDGE]
        right = [ln for ln in band if ln.x1 > g0 + EDGE]
        if left and right:
            head_l, left, foot_l = _peel(left, right)
            head_r, right, foot_r = _peel(right, left)
            for part in (head_l + head_r, left, right, foot_l + foot_r):
                if part:
                    groups.extend(_segment(part, depth + 1))
        else:
            groups.extend(_segment(band, depth + 1))
        band.clear()

    for ln in sorted(lines, key=lambda ln: (ln.y0, ln.x0)):
        if ln.x0 < g1 - EDGE and ln.x1 > g0 + EDGE:  # crosses the gutter: a band of its own
            close_band()
            groups.append([ln])
        else:
            band.append(ln)
    close_band()
    return groups


def _bands(lines: list[Line]) -> list[list[Line]]:
    """The region cut across at every blank strip taller than half a line: bands top to bottom."""
    ordered = sorted(lines, key=lambda ln: (ln.y0, ln.x0))
    heights = sorted(ln.y1 - ln.y0 for ln in ordered)
    gap = 0.5 * heights[len(heights) // 2]
    bands: list[list[Line]] = [[]]
    bottom = ordered[0].y1
    for ln in ordered:
        if bands[-1] and ln.y0 - bottom > gap:
            bands.append([])
        bands[-1].append(ln)
        bottom = max(bottom, ln.y1)
    return bands


def _peel(side: list[Line], other: list[Line]) -> tuple[list[Line], list[Line], list[Line]]:
    """Split off a side's lines that stand apart above or below both columns (a header or a
    footer that does not cross the gutter): beyond the other column's extent and separated from
    the column's body by a gap of several line heights. A column that merely runs longer than its
    neighbour has no such gap and stays whole."""
    lines = sorted(side, key=lambda ln: ln.y0)
    heights = sorted(ln.y1 - ln.y0 for ln in lines)
    gap = 2.5 * heights[len(heights) // 2]
    top, bottom = min(ln.y0 for ln in other), max(ln.y1 for ln in other)
    start, end = 0, len(lines)
    while (
        end - start > 1
        and lines[end - 1].y0 > bottom
        and lines[end - 1].y0 - lines[end - 2].y1 > gap
    ):
        end -= 1
    while end - start > 1 and lines[start].y1 < top and lines[start + 1].y0 - lines[start].y1 > gap:
        start += 1
    return lines[:start], lines[start:end], lines[end:]


def _find_gutter(lines: list[Line]) -> tuple[float, float] | None:
    """The widest vertical strip crossed by the fewest lines, with real columns on both sides."""
    left_edge = min(ln.x0 for ln in lines)
    right_edge = max(ln.x1 for ln in lines)
    width = right_edge - left_edge
    if width < 2 * MIN_GUTTER:
        return None
    # A column right of a gutter starts a gutter's width in from the left edge, one left of it
    # ends as far from the right edge: without two lines of each, no gutter (a page of prose).
    reach = MIN_GUTTER - EDGE - 0.1  # 0.1: the edges below are rounded
    if (
        sum(ln.x0 > left_edge + reach for ln in lines) < MIN_SIDE_LINES
        or sum(ln.x1 < right_edge - reach for ln in lines) < MIN_SIDE_LINES
    ):
        return None
    edges = sorted({round(v, 1) for ln in lines for v in (ln.x0, ln.x1)})
    # crossing[i]: lines that cross the strip between edges[i] and edges[i + 1]
    starts = sorted(round(ln.x0, 1) for ln in lines)
    ends = sorted(round(ln.x1, 1) for ln in lines)
    crossing = []
    si = ei = 0
    for i in range(len(edges) - 1):
        while si < len(starts) and starts[si] <= edges[i]:
            si += 1
        while ei < len(ends) and ends[ei] <= edges[i]:
            ei += 1
        crossing.append(si - ei)
    allowed = min(MAX_SPANNERS, max(1, len(lines) // 10))
    for limit in range(allowed + 1):
        best: tuple[float, float] | None = None
        i = 0
        while i < len(crossing):
            if crossing[i] > limit:
                i += 1
                continue
            j = i
            while j + 1 < len(crossing) and crossing[j + 1] <= limit:
                j += 1
            lo, hi = edges[i], edges[j + 1]
            i = j + 1
            if hi - lo < MIN_GUTTER or lo <= left_edge or hi >= right_edge:
                continue
            left = [ln for ln in lines if ln.x1 <= lo + EDGE]
            right = [ln for ln in lines if ln.x0 >= hi - EDGE]
            if len(left) < MIN_SIDE_LINES or len(right) < MIN_SIDE_LINES:
                continue
            left_span = max(ln.x1 for ln in left) - min(ln.x0 for ln in left)
            right_span = max(ln.x1 for ln in right) - min(ln.x0 for ln in right)
            if min(left_span, right_span) < MIN_SIDE_SHARE * width:
                continue
            if best is None or hi - lo > best[1] - best[0]:
                best = (lo, hi)
        if best is not None:
            return best
    return None


def _vertical(lines: list[Line]) -> str:
    """Vertical writing: columns right to left, each read top to bottom into one line."""
    columns: list[list[Line]] = []
    for ln in sorted(lines, key=lambda ln: -(ln.x0 + ln.x1)):
        for column in columns:
            c0 = min(x.x0 for x in column)
            c1 = max(x.x1 for x in column)
            overlap = min(c1, ln.x1) - max(c0, ln.x0)
            if overlap > 0.5 * min(c1 - c0, ln.x1 - ln.x0):
                column.append(ln)
                break
        else:
            columns.append([ln])
    out = []
    for column in columns:
        column.sort(key=lambda ln: (ln.y0, ln.order))
        out.append("".join(ln.text for ln in column))
    return "\n".join(out)
