"""Tables survive parsing (issue 41.1): a table of a PDF (ruled or not), Word, PowerPoint, HTML,
EPUB or CSV file becomes Markdown rows, one row a line with its cells in order, and every chunk of
a table that spans chunks starts with its header row. Real files, made here, read by the real
extraction code."""

import zipfile

import pymupdf

from sluice.pipeline.parsing import formats
from sluice.pipeline.parsing.extract import Request, read
from sluice.pipeline.running.chunk import chunk_pages, heading_of, split_text
from tests.support import pdfmaker

HEADER = "| Region | Sales | Growth |"
REGIONS = [
    ("North", "120", "5%"),
    ("South", "98", "3%"),
    ("East", "143", "7%"),
    ("West", "77", "-2%"),
    ("Harbour", "61", "11%"),
    ("Uplands", "55", "0%"),
]
ROWS = [f"| {a} | {b} | {c} |" for a, b, c in REGIONS]


def pages_of(path, media_type: str) -> list[tuple[int, str]]:
    return [
        (m["n"], m["text"])
        for m in read(Request(path=str(path), media_type=media_type))
        if m["t"] == "page"
    ]


def body_lines(text: str) -> list[str]:
    return [line for line in heading_of(text)[1].split("\n") if line.strip()]


def make_pdf(path, *, ruled: bool) -> None:
    doc = pymupdf.open()
    page = doc.new_page()
    page.insert_text((72, 72), "Sales by region in the year under review:", fontsize=11)
    y, xs = 90.0, [72, 200, 300, 400]
    for cells in [("Region", "Sales", "Growth"), *REGIONS]:
        for x, cell in zip(xs, cells, strict=False):
            page.insert_text((x + 4, y + 12), cell, fontsize=11)
        y += 18
    if ruled:
        for k in range(len(REGIONS) + 2):
            page.draw_line((72, 90 + 18 * k), (400, 90 + 18 * k))
        for x in xs:
            page.draw_line((x, 90), (x, 90 + 18 * (len(REGIONS) + 1)))
    page.insert_text((72, y + 30), "The harbour region grew fastest of all.", fontsize=11)
    doc.save(str(path))


def make_two_columns(path) -> None:
    """A page of two columns of prose: gutters between them in every line, and no table."""
    doc = pymupdf.open()
    page = doc.new_page()
    words = "the ferry leaves the harbour at dawn and returns before the evening tide".split()
    for i in range(30):
        left = " ".join(words[i % 5 :] + words[: i % 5])[:38]
        right = " ".join(words[(i + 3) % 7 :] + words[: (i + 3) % 7])[:38]
        page.insert_text((50, 80 + 14 * i), left, fontsize=10)
        page.insert_text((320, 80 + 14 * i), right, fontsize=10)
    doc.save(str(path))


def test_a_ruled_pdf_table_is_read_as_rows_in_order(tmp_path):
    make_pdf(tmp_path / "ruled.pdf", ruled=True)
    [(_, text)] = pages_of(tmp_path / "ruled.pdf", "application/pdf")
    lines = text.split("\n")
    start = lines.index(HEADER)
    assert lines[start : start + 2 + len(ROWS)] == [HEADER, "| --- | --- | --- |", *ROWS]
    assert text.index("year under review") < text.index(HEADER) < text.index("grew fastest")


def test_an_unruled_pdf_table_is_read_as_rows_too(tmp_path):
    make_pdf(tmp_path / "plain.pdf", ruled=False)
    [(_, text)] = pages_of(tmp_path / "plain.pdf", "application/pdf")
    lines = text.split("\n")
    assert lines[lines.index(HEADER) + 2 :][: len(ROWS)] == ROWS


def test_two_columns_of_prose_are_not_a_table(tmp_path):
    make_two_columns(tmp_path / "columns.pdf")
    [(_, text)] = pages_of(tmp_path / "columns.pdf", "application/pdf")
    assert "|" not in text
    assert "harbour" in text


def test_every_chunk_of_a_table_that_spans_chunks_keeps_its_header(tmp_path):
    make_pdf(tmp_path / "ruled.pdf", ruled=True)
    chunks = list(
        chunk_pages(pages_of(tmp_path / "ruled.pdf", "application/pdf"), size=110, overlap=20)
    )
    tabled = [c.text for c in chunks if any(row in c.text for row in ROWS)]
    assert len(tabled) >= 3
    for text in tabled:
        lines = body_lines(text)
        at = lines.index(HEADER)  # the words before the table may open its first chunk
        assert lines[at + 1] == "| --- | --- | --- |", text
        assert all(line in ROWS for line in lines[at + 2 :]), text  # cut between rows only
    seen = [line for text in tabled for line in body_lines(text) if line in ROWS]
    assert seen == ROWS  # every row once, in order


def test_a_re_run_makes_the_same_chunks(tmp_path):
    make_pdf(tmp_path / "ruled.pdf", ruled=True)
    runs = [
        list(chunk_pages(pages_of(tmp_path / "ruled.pdf", "application/pdf"), size=110, overlap=20))
        for _ in range(2)
    ]
    assert runs[0] == runs[1] and runs[0]


def docx_with_table(path) -> None:
    import docx

    document = docx.Document()
    document.add_paragraph("Sales by region:")
    table = document.add_table(rows=1 + len(REGIONS), cols=3)
    for i, cells in enumerate([("Region", "Sales", "Growth"), *REGIONS]):
        for j, cell in enumerate(cells):
            table.rows[i].cells[j].text = cell
    document.add_paragraph("The harbour grew fastest.")
    document.save(str(path))


def pptx_with_table(path) -> None:
    import pptx
    from pptx.util import Inches

    deck = pptx.Presentation()
    slide = deck.slides.add_slide(deck.slide_layouts[5])
    slide.shapes.title.text = "Sales"
    shape = slide.shapes.add_table(1 + len(REGIONS), 3, Inches(1), Inches(2), Inches(6), Inches(3))
    for i, cells in enumerate([("Region", "Sales", "Growth"), *REGIONS]):
        for j, cell in enumerate(cells):
            shape.table.cell(i, j).text = cell
    deck.save(str(path))


HTML_TABLE = (
    "<html><body><p>Sales by region:</p><table><thead><tr><th>Region</th><th>Sales</th>"
    "<th>Growth</th></tr></thead><tbody>"
    + "".join(f"<tr><td>{a}</td><td>{b}</td><td>{c}</td></tr>" for a, b, c in REGIONS)
    + "</tbody></table><p>The harbour grew fastest.</p></body></html>"
)


def epub_with_table(path) -> None:
    with zipfile.ZipFile(path, "w") as book:
        book.writestr(zipfile.ZipInfo("mimetype"), "application/epub+zip")
        book.writestr(
            "META-INF/container.xml",
            '<?xml version="1.0"?><container version="1.0" '
            'xmlns="urn:oasis:names:tc:opendocument:xmlns:container"><rootfiles>'
            '<rootfile full-path="OEBPS/content.opf" media-type="application/oebps-package+xml"/>'
            "</rootfiles></container>",
        )
        book.writestr(
            "OEBPS/content.opf",
            '<?xml version="1.0"?><package xmlns="http://www.idpf.org/2007/opf" version="3.0">'
            '<metadata xmlns:dc="http://purl.org/dc/elements/1.1/"><dc:title>Almanac</dc:title>'
            '</metadata><manifest><item id="c1" href="c1.xhtml" '
            'media-type="application/xhtml+xml"/></manifest><spine><itemref idref="c1"/></spine>'
            "</package>",
        )
        book.writestr("OEBPS/c1.xhtml", HTML_TABLE)


def test_office_web_and_book_tables_are_rows(tmp_path):
    docx_with_table(tmp_path / "t.docx")
    pptx_with_table(tmp_path / "t.pptx")
    (tmp_path / "t.html").write_text(HTML_TABLE)
    epub_with_table(tmp_path / "t.epub")
    for name, media_type in (
        ("t.docx", formats.DOCX),
        ("t.pptx", formats.PPTX),
        ("t.html", formats.HTML),
        ("t.epub", formats.EPUB),
    ):
        text = "\n".join(text for _, text in pages_of(tmp_path / name, media_type))
        lines = text.split("\n")
        assert HEADER in lines, (name, text)
        at = lines.index(HEADER)
        assert lines[at + 1 : at + 2 + len(ROWS)] == ["| --- | --- | --- |", *ROWS], (name, text)


def test_csv_keeps_its_header_in_every_chunk(tmp_path):
    rows = [("id", "name", "city")] + [
        (str(i), f"person {i}", f"town {i % 7}") for i in range(1, 61)
    ]
    (tmp_path / "people.csv").write_text("\n".join(",".join(r) for r in rows) + "\n")
    pages = pages_of(tmp_path / "people.csv", formats.CSV)
    chunks = list(chunk_pages(pages, size=200, overlap=30))
    assert len(chunks) > 5
    for c in chunks:
        assert c.text.split("\n")[:2] == ["| id | name | city |", "| --- | --- | --- |"], c.text
    seen = [line for c in chunks for line in c.text.split("\n")[2:]]
    assert seen == [f"| {i} | person {i} | town {i % 7} |" for i in range(1, 61)]


def test_a_table_row_is_never_cut_and_a_runaway_row_is_cut_as_text():
    table = "\n".join([HEADER, "| --- | --- | --- |", *ROWS])
    for size in (60, 90, 140):
        pieces = split_text("Before.\n" + table, size=size, overlap=10)
        assert [line for p in pieces for line in p.split("\n") if line in ROWS] == ROWS
        for text in pieces:
            assert all(line.endswith("|") for line in text.split("\n") if line.startswith("|"))
            assert HEADER in text or "|" not in text, text
    huge = "| " + "word " * 400 + "| x | y |"
    pieces = split_text("\n".join([HEADER, "| --- | --- | --- |", huge]), size=100, overlap=0)
    assert all(len(p) <= 100 for p in pieces)


def make_two_line_labels(path) -> None:
    """An unruled table under a bold header row whose labels take two lines each (a LibreOffice
    table of this kind): the second line of the first row's label is not a heading."""
    doc = pymupdf.open()
    page = doc.new_page()
    page.insert_text((72, 72), "Berths inspected this quarter:", fontsize=11)
    xs = [72, 200, 300, 400]
    for x, cell in zip(xs, ("Berth", "Depth", "Cost", "Owner"), strict=True):
        page.insert_text((x, 100), cell, fontsize=10, fontname="hebo")
    y = 116.0
    for i, (a, b, c) in enumerate(REGIONS):
        for x, cell in zip(xs, (a, b, c, f"Owner {i}"), strict=True):
            page.insert_text((x, y), cell, fontsize=10)
        page.insert_text((72, y + 11), f"(zone {i + 1})", fontsize=10)
        y += 26
    page.insert_text((72, y + 20), "Depths were taken at low water.", fontsize=11)
    doc.save(str(path))


def test_an_unruled_table_keeps_its_header_above_labels_of_two_lines(tmp_path):
    make_two_line_labels(tmp_path / "labels.pdf")
    [(_, text)] = pages_of(tmp_path / "labels.pdf", "application/pdf")
    lines = text.split("\n")
    assert "| Berth | Depth | Cost | Owner |" in lines, text
    assert "| North (zone 1) | 120 | 5% | Owner 0 |" in lines, text
    assert "| Uplands (zone 6) | 55 | 0% | Owner 5 |" in lines, text


def test_a_page_of_prose_is_passed_over_before_a_table_is_looked_for(tmp_path, monkeypatch):
    """The cheap check (rows of two cells, not all prose) stops a page of prose, in one column or
    two, before the table finder's passes; a page with a table goes on to them."""
    from sluice.pipeline.parsing import tables

    looked: list[int] = []
    candidates = tables._candidates
    monkeypatch.setattr(tables, "_candidates", lambda lines: looked.append(1) or candidates(lines))
    make_two_columns(tmp_path / "columns.pdf")
    (tmp_path / "prose.pdf").write_bytes(
        pdfmaker.text_pdf([" ".join(pdfmaker.SENTENCES_LEFT + pdfmaker.SENTENCES_RIGHT)])
    )
    for name in ("columns.pdf", "prose.pdf"):
        [(_, text)] = pages_of(tmp_path / name, "application/pdf")
        assert "harbour" in text and "|" not in text
    assert looked == []
    make_pdf(tmp_path / "plain.pdf", ruled=False)
    [(_, text)] = pages_of(tmp_path / "plain.pdf", "application/pdf")
    assert looked == [1] and HEADER in text


def make_tight_columns(path, *, ruled: bool = False, grouped: bool = False) -> None:
    """A table set tight, as LibreOffice sets one with its default padding: each right-aligned
    number ends a few points before the word of the next column starts, on one line."""
    doc = pymupdf.open()
    page = doc.new_page()
    page.insert_text((72, 72), "Tonnage and remarks by berth:", fontsize=11)
    font = pymupdf.Font("helv")
    y = 100.0
    if grouped:  # the berth's name over both header rows, a group over the other columns
        page.insert_text((72, 84), "Berth", fontsize=10)
        page.insert_text((187, 84), "Season 2024 survey", fontsize=10)
    for a, b, c in [
        ("" if grouped else "Berth", "Tonnes", "Remark"),
        *[(r, s, f"dredged {g}") for r, s, g in REGIONS],
    ]:
        if a:
            page.insert_text((72, y), a, fontsize=10)
        page.insert_text((220 - font.text_length(b, fontsize=10), y), b, fontsize=10)
        page.insert_text((225, y), c, fontsize=10)
        y += 16
    if ruled:  # a grid whose rule between the two columns runs in the space between them
        for k in range(len(REGIONS) + 2):
            page.draw_line((68, 88 + 16 * k), (330, 88 + 16 * k))
        for x in (68, 150, 222.5, 330):
            page.draw_line((x, 88), (x, 88 + 16 * (len(REGIONS) + 1)))
    doc.save(str(path))


def test_cells_set_tight_keep_the_space_between_their_words(tmp_path):
    make_tight_columns(tmp_path / "tight.pdf")
    [(_, text)] = pages_of(tmp_path / "tight.pdf", "application/pdf")
    assert "120 dredged 5%" in text or "| 120 | dredged 5% |" in text, text
    assert "120dredged" not in text, text


def make_grouped_header(path) -> None:
    """An unruled table whose header groups its columns in twos under a season, with the
    columns' own names on the row below."""
    doc = pymupdf.open()
    page = doc.new_page()
    page.insert_text((72, 72), "Depth and cost by season:", fontsize=11)
    xs = [72, 160, 230, 300, 370]
    page.insert_text((xs[0], 100), "Berth", fontsize=10, fontname="hebo")
    for x, group in ((xs[1], "Season 2023 results"), (xs[3], "Season 2024 results")):
        page.insert_text((x, 100), group, fontsize=10, fontname="hebo")
    for x, name in zip(xs[1:], ("Depth", "Cost", "Depth", "Cost"), strict=True):
        page.insert_text((x, 114), name, fontsize=10, fontname="hebo")
    for i, (region, sales, _) in enumerate(REGIONS):
        cells = (region, f"{i + 10}", sales, f"{i + 20}", f"{int(sales) + 1}")
        for x, cell in zip(xs, cells, strict=True):
            page.insert_text((x, 130 + 14 * i), cell, fontsize=10)
    doc.save(str(path))


def test_a_header_row_of_groups_keeps_the_columns_under_it_apart(tmp_path):
    make_grouped_header(tmp_path / "groups.pdf")
    [(_, text)] = pages_of(tmp_path / "groups.pdf", "application/pdf")
    lines = text.split("\n")
    assert "|  | Depth | Cost | Depth | Cost |" in lines, text
    assert "| North | 10 | 120 | 20 | 121 |" in lines, text
    assert "| Berth | Season 2023 results |  | Season 2024 results |  |" in lines, text


def test_cells_set_tight_are_cut_where_their_edges_line_up_down_the_rows(tmp_path):
    make_tight_columns(tmp_path / "tight.pdf")
    [(_, text)] = pages_of(tmp_path / "tight.pdf", "application/pdf")
    lines = text.split("\n")
    assert "| Berth | Tonnes | Remark |" in lines, text
    assert "| North | 120 | dredged 5% |" in lines, text
    assert "| Uplands | 55 | dredged 0% |" in lines, text


def test_a_ruled_table_set_tight_keeps_its_columns(tmp_path):
    make_tight_columns(tmp_path / "tight.pdf", ruled=True)
    [(_, text)] = pages_of(tmp_path / "tight.pdf", "application/pdf")
    lines = text.split("\n")
    assert "| Berth | Tonnes | Remark |" in lines, text
    assert "| North | 120 | dredged 5% |" in lines, text


def test_cells_set_tight_are_cut_under_a_header_of_groups_too(tmp_path):
    make_tight_columns(tmp_path / "tight.pdf", grouped=True)
    [(_, text)] = pages_of(tmp_path / "tight.pdf", "application/pdf")
    lines = text.split("\n")
    assert "| Berth | Season 2024 survey |  |" in lines, text
    assert "|  | Tonnes | Remark |" in lines, text
    assert "| North | 120 | dredged 5% |" in lines, text
