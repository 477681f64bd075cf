"""Tables of a PDF page as rows of cells, found from the lines the page's text already gave.

Plain text reads a table cell by cell, one per line, and the XY cut reads it column by column:
either way its rows are gone. Here, before the reading order is made:

- a page without three rows of two cells, not all prose, is passed over first, for the cost of
  a sort of its lines (``_may_hold_table``): a page of prose costs what it did;
- the page's horizontal lines are grouped into visual rows; a run of rows whose cells leave the
  same vertical gutters free (a gutter is blank in every row) is a table candidate. Rows whose
  cells are all prose (a two-column page, a form of sentences) are not table rows, and an edge
  column of prose that runs on above or below the run (the other column of a two-column page)
  is left out of it. A candidate needs three rows of two cells and two columns filled in half of
  its rows. A first row of groups over columns does not hide the gutters of the rows below it,
  and spans set tight (a right-aligned number a space before the next column's words) are cut
  where their edges line up down the rows;
- only on a page with a candidate are its drawings read: ruled candidates go to PyMuPDF's table
  finder (``page.find_tables``, line strategy), whose cell grid keeps cells of several lines
  together; others are cut at their gutters, a line that follows closer than the rows are apart
  continuing the row above;
- each table becomes one line of Markdown rows (sluice.pipeline.running.chunk.table_lines), the
  first row its header, placed where the table stood.
"""

from __future__ import annotations

import os
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

from sluice.pipeline.parsing.reading import Line
from sluice.pipeline.running.chunk import table_lines

SPAN_GAP = 1.0  # font sizes of blank between two spans of one line that makes them two cells
SPACED = 0.15  # font sizes of blank between two spans that a space stood in (never in a word)
ALIGNED = 1.0  # points within which span edges of several rows line up (a column's edge)
MIN_GUTTER = 3.0  # points of blank a gutter keeps in every row of a table
MIN_ROWS = 3  # rows of two cells or more, the header among them
MAX_ROW_GAP = 2.5  # line heights of blank that end a table
FILLED = 0.5  # share of rows a column has cells in
PROSE_CHARS, PROSE_WORDS = 25, 4  # a cell this long is prose (a column of a page, a sentence)
CONTINUED = 0.5  # a line nearer to the row above than this share of the row spacing continues it
RULED_EDGES = 2  # drawn lines each way within a candidate for the table finder to read it
MAX_TABLE_LINES = 2000  # past this (a map, a dense chart) no table is looked for


@dataclass
class _Cell:
    x0: float
    x1: float
    y0: float
    y1: float
    text: str
    line: Line
    # (x0, x1, text) of the spans it was joined from, where it was joined from several
    pieces: list[tuple[float, float, str]] = field(default_factory=list)

    @property
    def prose(self) -> bool:
        return len(self.text) >= PROSE_CHARS and len(self.text.split()) >= PROSE_WORDS


@dataclass
class _Candidate:
    rows: list[list[_Cell]] = field(default_factory=list)
    gutters: list[tuple[float, float]] = field(default_factory=list)

    @property
    def bottom(self) -> float:
        return max(c.y1 for c in self.rows[-1])

    def bbox(self) -> tuple[float, float, float, float]:
        cells = [c for row in self.rows for c in row]
        return (
            min(c.x0 for c in cells),
            min(c.y0 for c in cells),
            max(c.x1 for c in cells),
            max(c.y1 for c in cells),
        )


def take_tables(page, lines: list[Line]) -> list[Line]:
    """``lines`` with each table's lines replaced by one line holding its Markdown rows."""
    horizontal = [ln for ln in lines if ln.horizontal]
    if len(horizontal) < 2 * MIN_ROWS or len(horizontal) > MAX_TABLE_LINES:
        return lines
    if not _may_hold_table(horizontal):
        return lines
    found = _candidates(horizontal)
    if not found:
        return lines
    tables: list[tuple[tuple[float, float, float, float], list[list[str]], set[int]]] = []
    ruled = _ruled_tables(page, [c.bbox() for c, _ in found], horizontal)
    for candidate, columns in found:
        box = candidate.bbox()
        grid = next((t for t in ruled if _overlap(t[0], box) > 0.5), None)
        if grid is not None:
            if all(grid is not t for t in tables):
                tables.append(grid)
            continue
        rows = _rows(candidate, columns)
        if rows:
            tables.append((box, rows, {c.line.order for row in candidate.rows for c in row}))
    if not tables:
        return lines
    taken = set().union(*(t[2] for t in tables))
    out = [ln for ln in lines if ln.order not in taken]
    for (x0, y0, x1, y1), rows, members in tables:
        first = min(members)
        out.append(Line(x0, y0, x1, y1, "\n".join(table_lines(rows)), -1 - first, first))
    return out


def _may_hold_table(lines: list[Line]) -> bool:
    """Can the page hold MIN_ROWS table rows? The rows of ``_visual_rows``, made of whole lines
    (a line's cells share its height, so the rows are the same), counted where they may be table
    rows: two lines side by side or a line of spans far apart, not all of them prose. A page of
    prose, in one column or several, is passed over for the cost of a sort."""
    count = 0
    row: list[Line] = []
    top = bottom = 0.0
    for ln in sorted(lines, key=lambda ln: ln.y0 + ln.y1):
        y0, y1 = ln.y0, ln.y1
        height = y1 - y0 if y1 - y0 > 0.1 else 0.1
        if row and (
            (bottom if bottom < y1 else y1) - (top if top > y0 else y0)
            >= 0.5 * (height if height < bottom - top else bottom - top)
        ):
            row.append(ln)
            top, bottom = (top if top < y0 else y0), (bottom if bottom > y1 else y1)
            continue
        if row and (len(row) > 1 or row[0].spans):  # one line of one span: no row of cells
            count += _may_be_row(row)
            if count >= MIN_ROWS:
                return True
        row, top, bottom = [ln], y0, y1
    return count + _may_be_row(row) >= MIN_ROWS


def _may_be_row(row: list[Line]) -> bool:
    """Can these lines of one height give a table row: two cells or more, one not prose?"""
    if not row:
        return False
    if len(row) == 1:
        ln = row[0]
        gap = SPAN_GAP * max(ln.size, 4.0)
        return any(b[0] - a[1] >= gap for a, b in zip(ln.spans, ln.spans[1:], strict=False))
    for ln in row:
        if len(ln.spans) > 1:
            return True
        text = ln.text.strip()
        if len(text) < PROSE_CHARS or len(text.split()) < PROSE_WORDS:
            return True
    return False


def _segments(line: Line) -> list[_Cell]:
    """A line as cells: its spans apart by more than SPAN_GAP font sizes are cells of their own."""
    if not line.spans:
        return [_Cell(line.x0, line.x1, line.y0, line.y1, line.text.strip(), line)]
    gap = SPAN_GAP * max(line.size, 4.0)
    groups: list[list[tuple[float, float, str]]] = []
    for span in line.spans:
        if groups and span[0] - max(p[1] for p in groups[-1]) < gap:
            groups[-1].append(span)
        else:
            groups.append([span])
    cells = [_joined(pieces, line) for pieces in groups]
    return [c for c in cells if c.text]


def _joined(pieces: list[tuple[float, float, str]], line: Line) -> _Cell:
    """One cell of spans; where a blank stood between two of them, a space span did (dropped
    from the spans with the other blank ones): it is put back."""
    text = pieces[0][2]
    for (_, x1, _), (x0, _, more) in zip(pieces, pieces[1:], strict=False):
        text += (" " if x0 - x1 > SPACED * line.size else "") + more
    return _Cell(
        pieces[0][0],
        max(p[1] for p in pieces),
        line.y0,
        line.y1,
        " ".join(text.split()),
        line,
        pieces if len(pieces) > 1 else [],
    )


@dataclass
class _Bound:
    """Where two spans joined into one cell meet: the left one's end, the right one's start."""

    row: int
    cell: _Cell
    k: int  # between the cell's pieces k and k + 1
    end: float
    start: float


def _worded(text: str) -> bool:
    """Does a span hold a letter or digit (not a dot leader's dot)?"""
    return any(ch.isalnum() for ch in text)


def _split_aligned(rows: list[list[_Cell]]) -> None:
    """Cut cells joined from spans where the spans' edges line up down the rows: a number set
    right in its column a space before the next column's words (LibreOffice's tight tables), in
    MIN_ROWS rows or more, with nothing of any row but the first across that line."""
    bounds = [
        _Bound(r, cell, k, a[1], b[0])
        for r, row in enumerate(rows)
        for cell in row
        for k, (a, b) in enumerate(zip(cell.pieces, cell.pieces[1:], strict=False))
        if b[0] - a[1] > SPACED * cell.line.size and _worded(a[2]) and _worded(b[2])
    ]
    if len(bounds) < MIN_ROWS:
        return
    # the first row may cross the line: a header of groups, each over columns
    pieces = [(c.x0, c.x1) for row in rows[1:] for c in row if not c.pieces] + [
        (p[0], p[1]) for row in rows[1:] for c in row for p in c.pieces
    ]
    cut: set[tuple[int, int]] = set()
    edges: tuple[tuple[Callable[[_Bound], float], float], ...] = (
        (lambda b: b.end, 0.5),  # the ends of a right-aligned column
        (lambda b: b.start, -0.5),  # the starts of a left-aligned one
    )
    for edge, side in edges:
        ordered = sorted(bounds, key=edge)
        first = 0
        for last in range(1, len(ordered) + 1):
            if last < len(ordered) and edge(ordered[last]) - edge(ordered[first]) <= ALIGNED:
                continue
            group = ordered[first:last]
            first = last
            if len({b.row for b in group}) < MIN_ROWS:
                continue
            x = statistics.median(edge(b) for b in group) + side
            if all(not (x0 < x < x1) for x0, x1 in pieces):
                cut.update((id(b.cell), b.k) for b in group)
    if not cut:
        return
    for row in rows:
        split: list[_Cell] = []
        for cell in row:
            at = [k + 1 for k in range(len(cell.pieces) - 1) if (id(cell), k) in cut]
            if not at:
                split.append(cell)
                continue
            for a, b in zip([0, *at], [*at, len(cell.pieces)], strict=True):
                split.append(_joined(cell.pieces[a:b], cell.line))
        row[:] = split


def _visual_rows(lines: list[Line]) -> list[list[_Cell]]:
    """Cells grouped into rows: those whose heights overlap by half, top to bottom, left to
    right."""
    cells = sorted((c for ln in lines for c in _segments(ln)), key=lambda c: (c.y0 + c.y1) / 2)
    rows: list[list[_Cell]] = []
    top = bottom = 0.0
    for cell in cells:
        height = max(cell.y1 - cell.y0, 0.1)
        if rows and min(bottom, cell.y1) - max(top, cell.y0) >= 0.5 * min(height, bottom - top):
            rows[-1].append(cell)
            top, bottom = min(top, cell.y0), max(bottom, cell.y1)
        else:
            rows.append([cell])
            top, bottom = cell.y0, cell.y1
    for row in rows:
        row.sort(key=lambda c: c.x0)
    return rows


def _free(gutters: list[tuple[float, float]], row: list[_Cell]) -> list[tuple[float, float]]:
    """The parts of ``gutters`` that no cell of ``row`` covers, at least MIN_GUTTER wide."""
    out = gutters
    for cell in row:
        cut: list[tuple[float, float]] = []
        for g0, g1 in out:
            if cell.x1 <= g0 or cell.x0 >= g1:
                cut.append((g0, g1))
                continue
            if cell.x0 - g0 >= MIN_GUTTER:
                cut.append((g0, cell.x0))
            if g1 - cell.x1 >= MIN_GUTTER:
                cut.append((cell.x1, g1))
        out = cut
    return out


def _gaps(row: list[_Cell]) -> list[tuple[float, float]]:
    return [(a.x1, b.x0) for a, b in zip(row, row[1:], strict=False) if b.x0 - a.x1 >= MIN_GUTTER]


def _candidates(lines: list[Line]) -> list[tuple[_Candidate, list[tuple[float, float]]]]:
    """Runs of rows that keep gutters free, as (candidate, its columns' x ranges)."""
    found: list[tuple[_Candidate, list[tuple[float, float]]]] = []
    current: _Candidate | None = None

    def close() -> None:
        if current is not None:
            # a table ends with a row of cells, or the last line of one of its cells
            while len(current.rows[-1]) == 1 and not _continues(current.rows):
                current.rows.pop()
            _split_aligned(current.rows)
            current.gutters = _gaps(current.rows[0])
            for row in current.rows[1:]:
                current.gutters = _free(current.gutters, row)
            if len(current.rows) > MIN_ROWS:
                # a header row of groups, each over columns of the rows below it, hides their
                # gutters: the columns are those of the rows below, a group falls in its first
                x0, _, x1, _ = current.bbox()
                finer = [(x0, x1)]
                for row in current.rows[1:]:
                    finer = _free(finer, row)
                finer = [g for g in finer if x0 < g[0] and g[1] < x1]
                if len(finer) > len(current.gutters):
                    current.gutters = finer
            columns = _accepted(current, lines)
            if columns:
                found.append((current, columns))

    for row in _visual_rows(lines):
        gaps = _gaps(row)
        table_row = len(row) >= 2 and bool(gaps) and not all(c.prose for c in row)
        if current is not None:
            height = statistics.median(c.y1 - c.y0 for c in row)
            near = min(c.y0 for c in row) - current.bottom <= MAX_ROW_GAP * height
            free = _free(current.gutters, row) if near else []
            if free and (table_row or (len(row) == 1 and _alike(row[0], current.rows[-1]))):
                current.rows.append(row)
                current.gutters = free
                continue
            close()
            current = None
        if table_row:
            current = _Candidate([row], gaps)
    close()
    return found


def _continues(rows: list[list[_Cell]]) -> bool:
    """Is the last of ``rows`` a lone line that goes on with the cell above it: nearer to the
    row above than the rows of cells are apart?"""
    if len(rows) < 2:
        return False
    gaps = [
        min(c.y0 for c in row) - max(c.y1 for c in above)
        for above, row in zip(rows, rows[1:], strict=False)
    ]
    spacing = [g for g, row in zip(gaps, rows[1:], strict=True) if len(row) >= 2]
    if not spacing:
        return False
    apart = statistics.median(spacing)
    return apart - gaps[-1] > 1.0 and gaps[-1] < CONTINUED * apart


def _alike(cell: _Cell, row: list[_Cell]) -> bool:
    """Is a lone line set like the cells of the row above it (a cell's second line, not a
    heading)? Compared with the cells above it, else with any of the row's: a body cell's second
    line under a bold header row is a body cell's."""
    above = [c for c in row if c.x0 < cell.x1 and cell.x0 < c.x1] or row
    return any(
        abs(cell.line.size - c.line.size) < 0.5 and cell.line.bold == c.line.bold for c in above
    )


def _columns(candidate: _Candidate) -> list[tuple[float, float]]:
    x0, _, x1, _ = candidate.bbox()
    edges = [x0] + [v for g in sorted(candidate.gutters) for v in g] + [x1]
    return [(edges[i], edges[i + 1]) for i in range(0, len(edges), 2)]


def _column_of(cell: _Cell, columns: list[tuple[float, float]]) -> int:
    """The column of a cell's middle; a cell across a gutter (a group over columns) falls in the
    first column it covers."""
    middle = (cell.x0 + cell.x1) / 2
    at = next((i for i, (_, c1) in enumerate(columns) if middle <= c1), len(columns) - 1)
    while at and cell.x0 < columns[at - 1][1] and cell.x1 > columns[at][0]:
        at -= 1
    return at


def _accepted(candidate: _Candidate, lines: list[Line]) -> list[tuple[float, float]]:
    """The candidate's columns when it is a table (an edge column of running prose left out),
    else []."""
    if sum(len(row) >= 2 for row in candidate.rows) < MIN_ROWS:
        return []
    columns = [c for c in _columns(candidate) if c[1] > c[0]]
    for edge in (len(columns) - 1, 0):
        if len(columns) > 2 and _running_prose(candidate, columns, edge, lines):
            _drop_column(candidate, columns[edge])
            del columns[edge]
    if len(columns) < 2:
        return []
    filled = [0] * len(columns)
    for row in candidate.rows:
        for i in {_column_of(c, columns) for c in row}:
            filled[i] += 1
    multi = [row for row in candidate.rows if len({_column_of(c, columns) for c in row}) >= 2]
    if len(multi) < MIN_ROWS or sum(f >= FILLED * len(candidate.rows) for f in filled) < 2:
        return []
    return columns


def _running_prose(
    candidate: _Candidate, columns: list[tuple[float, float]], edge: int, lines: list[Line]
) -> bool:
    """Is the edge column prose that goes on above or below the candidate (the other column of
    a page), rather than a column of the table?"""
    c0, c1 = columns[edge]
    cells = [c for row in candidate.rows for c in row if _column_of(c, columns) == edge]
    if not cells or sum(c.prose for c in cells) < 0.8 * len(cells):
        return False
    _, top, _, bottom = candidate.bbox()
    members = {c.line.order for row in candidate.rows for c in row}
    return any(
        ln.order not in members
        and (ln.y1 <= top or ln.y0 >= bottom)
        and ln.x0 >= c0 - MIN_GUTTER
        and ln.x1 <= c1 + MIN_GUTTER
        for ln in lines
    )


def _drop_column(candidate: _Candidate, column: tuple[float, float]) -> None:
    c0, c1 = column
    candidate.rows = [
        kept for row in candidate.rows if (kept := [c for c in row if c.x1 <= c0 or c.x0 >= c1])
    ]
    candidate.gutters = [g for g in candidate.gutters if g[1] <= c0 or g[0] >= c1]


def _rows(candidate: _Candidate, columns: list[tuple[float, float]]) -> list[list[str]]:
    """The candidate's cells per row and column; a line nearer to the row above than the rows
    are apart continues that row's cells."""
    gaps = [
        min(c.y0 for c in row) - max(c.y1 for c in above)
        for above, row in zip(candidate.rows, candidate.rows[1:], strict=False)
    ]
    spacing = statistics.median(gaps) if gaps else 0.0
    wide = [g for g in gaps if g >= spacing]
    spacing = statistics.median(wide) if wide else spacing
    out: list[list[str]] = []
    for i, row in enumerate(candidate.rows):
        cells = [""] * len(columns)
        for cell in row:
            k = _column_of(cell, columns)
            cells[k] = f"{cells[k]} {cell.text}".strip()
        gap = gaps[i - 1] if i else 0.0
        if out and spacing - gap > 1.0 and gap < CONTINUED * spacing:
            out[-1] = [f"{a} {b}".strip() for a, b in zip(out[-1], cells, strict=True)]
        else:
            out.append(cells)
    return out if len(out) >= 2 else []


def _overlap(a: tuple[float, ...], b: tuple[float, ...]) -> float:
    """The share of the smaller box that the two boxes share."""
    w = min(a[2], b[2]) - max(a[0], b[0])
    h = min(a[3], b[3]) - max(a[1], b[1])
    if w <= 0 or h <= 0:
        return 0.0
    smaller = min((a[2] - a[0]) * (a[3] - a[1]), (b[2] - b[0]) * (b[3] - b[1]))
    return w * h / max(smaller, 1e-6)


def _ruled_tables(
    page, boxes: list[tuple[float, float, float, float]], lines: list[Line]
) -> list[tuple[tuple[float, float, float, float], list[list[str]], set[int]]]:
    """Tables the table finder reads on candidates drawn with rules: (bbox, rows, line orders)."""
    ruled = [(box, extent) for box in boxes if (extent := _edges(page, box)) is not None]
    if not ruled:
        return []
    import pymupdf

    os.environ["PYMUPDF_SUGGEST_LAYOUT_ANALYZER"] = "0"  # its advice, printed on stdout
    pymupdf.set_messages(stream=sys.stderr)
    out = []
    for box, extent in ruled:  # the clip holds the whole grid: rules run past the text
        clip = pymupdf.Rect(
            min(box[0], extent[0]) - 6,
            min(box[1], extent[1]) - 6,
            max(box[2], extent[2]) + 6,
            max(box[3], extent[3]) + 6,
        )
        try:
            finder = page.find_tables(clip=clip, strategy="lines")
        except Exception as exc:  # a page the finder cannot read keeps the rows read from text
            if isinstance(exc, MemoryError):
                raise
            continue
        for table in getattr(finder, "tables", None) or ():
            if table.col_count < 2:
                continue
            found = tuple(table.bbox)
            members = [ln for ln in lines if _inside(ln, found)]
            rows = [row for row in _grid_rows(table, members) if any(row)]
            if len(rows) >= 2:
                out.append((found, rows, {ln.order for ln in members}))
    return out


def _grid_rows(table, members: list[Line]) -> list[list[str]]:
    """The text of each cell of the finder's grid, from the page's own lines (their cells whose
    middles fall in it, top to bottom): the finder gives the grid, the lines the words. A cell
    of the lines joined from spans that fall in two cells of the grid (set tight) is cut."""
    grid = [list(row.cells) for row in table.rows]
    texts: list[list[list[str]]] = [[[] for _ in row] for row in grid]

    def place(x0: float, x1: float, y0: float, y1: float) -> tuple[int, int] | None:
        x, y = (x0 + x1) / 2, (y0 + y1) / 2
        for i, row in enumerate(grid):
            for j, cell in enumerate(row):
                if cell is not None and cell[0] <= x <= cell[2] and cell[1] <= y <= cell[3]:
                    return i, j
        return None

    pieces: list[_Cell] = []
    for ln in members:
        for cell in _segments(ln):
            if not cell.pieces:
                pieces.append(cell)
                continue
            runs: list[list[tuple[float, float, str]]] = []
            last = None
            for span in cell.pieces:
                at = place(span[0], span[1], cell.y0, cell.y1)
                if runs and at == last:
                    runs[-1].append(span)
                else:
                    runs.append([span])
                last = at
            pieces.extend(_joined(run, ln) for run in runs)
    for piece in sorted(pieces, key=lambda c: (c.y0, c.x0)):
        at = place(piece.x0, piece.x1, piece.y0, piece.y1)
        if at is not None:
            texts[at[0]][at[1]].append(piece.text)
    return [[" ".join(" ".join(cell).split()) for cell in row] for row in texts]


def _inside(line: Line, box: tuple[float, ...]) -> bool:
    """Is the middle of ``line`` inside ``box``?"""
    x, y = (line.x0 + line.x1) / 2, (line.y0 + line.y1) / 2
    return box[0] <= x <= box[2] and box[1] <= y <= box[3]


def _edges(page, box: tuple[float, float, float, float]) -> tuple[float, ...] | None:
    """The extent of the rules the page draws across ``box`` when they run both ways (a grid,
    for the finder to read), else None."""
    x0, y0, x1, y1 = box[0] - 6, box[1] - 6, box[2] + 6, box[3] + 6
    across = down = 0
    extent = [x0, y0, x1, y1]
    try:
        drawings = _drawings(page)
    except Exception as exc:
        if isinstance(exc, MemoryError):
            raise
        return None
    for path in drawings:
        r = path.get("rect")
        if r is None or r[2] < x0 or r[0] > x1 or r[3] < y0 or r[1] > y1:
            continue
        extent = [
            min(extent[0], r[0]),
            min(extent[1], r[1]),
            max(extent[2], r[2]),
            max(extent[3], r[3]),
        ]
        for item in path.get("items", ()):
            if item[0] == "l":
                (ax, ay), (bx, by) = item[1], item[2]
                across += abs(ay - by) < 1 and abs(ax - bx) > 3
                down += abs(ax - bx) < 1 and abs(ay - by) > 3
            elif item[0] == "re":  # a thin filled bar is a rule; a stroked box has four
                rx0, ry0, rx1, ry1 = item[1]
                thin_h, thin_w = ry1 - ry0 < 2, rx1 - rx0 < 2
                stroked = "s" in path.get("type", "") and not thin_h and not thin_w
                across += 2 if stroked else int(thin_h and rx1 - rx0 > 3)
                down += 2 if stroked else int(thin_w and ry1 - ry0 > 3)
    return tuple(extent) if across >= RULED_EDGES and down >= RULED_EDGES else None


def _drawings(page) -> list[dict]:
    cached = getattr(page, "_sluice_drawings", None)
    if cached is None:
        cached = page.get_cdrawings()
        page._sluice_drawings = cached
    return cached
