"""Small PDFs made on the spot, one per way a file from the wild goes wrong.

PyMuPDF writes the ordinary ones; a few are assembled object by object, because no producer would
write them on purpose (a page tree that loops, a negative page count); reportlab writes vertical
Japanese the way Japanese producers do (a CID font in vertical mode, one glyph at a time).
"""

from __future__ import annotations

import io
import zlib

import pymupdf

SENTENCES_LEFT = [
    f"Left column sentence number {i} describes the river delta in detail." for i in range(1, 13)
]
SENTENCES_RIGHT = [
    f"Right column sentence number {i} explains the harbour cranes at length." for i in range(1, 13)
]


def text_pdf(pages: list[str]) -> bytes:
    doc = pymupdf.open()
    for text in pages:
        page = doc.new_page()
        if text:
            page.insert_textbox(pymupdf.Rect(72, 72, 540, 760), text, fontsize=11)
    return doc.tobytes()


def assemble(objects: list[bytes], *, root: int = 1) -> bytes:
    """A PDF from raw object bodies (object i+1 is objects[i]) with a correct xref table."""
    out = io.BytesIO()
    out.write(b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(out.tell())
        out.write(b"%d 0 obj\n%s\nendobj\n" % (number, body))
    xref = out.tell()
    out.write(b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1))
    for offset in offsets:
        out.write(b"%010d 00000 n \n" % offset)
    out.write(
        b"trailer\n<< /Size %d /Root %d 0 R >>\nstartxref\n%d\n%%%%EOF\n"
        % (len(objects) + 1, root, xref)
    )
    return out.getvalue()


def _stream(data: bytes, *, compress: bool = False) -> bytes:
    if compress:
        data = zlib.compress(data, 9)
        return b"<< /Length %d /Filter /FlateDecode >>\nstream\n%s\nendstream" % (len(data), data)
    return b"<< /Length %d >>\nstream\n%s\nendstream" % (len(data), data)


_FONT = b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"


def _page(contents: int, parent: int = 2) -> bytes:
    return (
        b"<< /Type /Page /Parent %d 0 R /MediaBox [0 0 612 792] /Contents %d 0 R "
        b"/Resources << /Font << /F1 5 0 R >> >> >>" % (parent, contents)
    )


def _show(text: bytes) -> bytes:
    return _stream(b"BT /F1 12 Tf 72 720 Td (" + text + b") Tj ET")


def page_tree_cycle() -> bytes:
    """Every page lookup raises FzErrorFormat "cycle in page tree" (a plain Exception)."""
    return assemble(
        [
            b"<< /Type /Catalog /Pages 2 0 R >>",
            b"<< /Type /Pages /Kids [2 0 R 3 0 R] /Count 2 >>",
            _page(4),
            _show(b"unreachable words"),
            _FONT,
        ]
    )


def invalid_page_count() -> bytes:
    """Opening or counting pages raises "Invalid number of pages"."""
    return assemble(
        [
            b"<< /Type /Catalog /Pages 2 0 R >>",
            b"<< /Type /Pages /Kids [3 0 R] /Count -5 >>",
            _page(4),
            _show(b"unreachable words"),
            _FONT,
        ]
    )


def one_broken_page() -> bytes:
    """Page 1 reads; page 2 sits in a subtree that loops onto itself."""
    return assemble(
        [
            b"<< /Type /Catalog /Pages 2 0 R >>",
            b"<< /Type /Pages /Kids [3 0 R 6 0 R] /Count 2 >>",
            _page(4),
            _show(b"The readable first page tells of lighthouses and their keepers."),
            _FONT,
            b"<< /Type /Pages /Parent 2 0 R /Kids [6 0 R] /Count 1 >>",
        ]
    )


def text_bomb(chars: int, *, then: bytes = b"") -> bytes:
    """One page whose small compressed content stream shows ``chars`` characters; with ``then``,
    a second, ordinary page that says it."""
    run = b"1 0 0 1 20 20 Tm (" + b"A" * 1000 + b") Tj\n"  # each run starts again inside the page
    body = b"BT /F1 0.2 Tf " + run * (chars // 1000) + b"ET"
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R%s] /Count %d >>"
        % (b" 6 0 R" if then else b"", 2 if then else 1),
        _page(4),
        _stream(body, compress=True),
        _FONT,
    ]
    if then:
        objects += [_page(7), _show(then)]
    return assemble(objects)


def xfa_form() -> bytes:
    """A dynamic XFA form as Designer writes it: the page holds only the viewer placeholder."""
    doc = pymupdf.open()
    page = doc.new_page()
    page.insert_textbox(
        pymupdf.Rect(72, 72, 540, 300),
        (
            "Please wait...\n\nIf this message is not eventually replaced by the proper contents "
            "of the document, your PDF viewer may not be able to display this type of document."
        ),
        fontsize=11,
    )
    xml = doc.get_new_xref()
    doc.update_object(xml, "<< >>")
    doc.update_stream(xml, b'<xdp:xdp xmlns:xdp="http://ns.adobe.com/xdp/"><template/></xdp:xdp>')
    doc.xref_set_key(doc.pdf_catalog(), "AcroForm", f"<< /Fields [] /XFA {xml} 0 R >>")
    return doc.tobytes()


def page_numbers_only(words_page: str) -> bytes:
    """A text page followed by pages that hold nothing but their page number."""
    doc = pymupdf.open()
    doc.new_page().insert_textbox(pymupdf.Rect(72, 72, 540, 760), words_page, fontsize=11)
    for n in (2, 3, 4):
        doc.new_page().insert_text((300, 770), str(n), fontsize=9)
    return doc.tobytes()


def drawings_only() -> bytes:
    doc = pymupdf.open()
    for _ in range(2):
        page = doc.new_page()
        page.draw_rect(pymupdf.Rect(100, 100, 400, 300), color=(0, 0, 1), width=2)
        page.draw_line((100, 400), (500, 600))
    return doc.tobytes()


def blank() -> bytes:
    doc = pymupdf.open()
    doc.new_page()
    doc.new_page()
    return doc.tobytes()


def image_only() -> bytes:
    doc = pymupdf.open()
    pix = pymupdf.Pixmap(pymupdf.csRGB, pymupdf.IRect(0, 0, 64, 64), False)
    pix.clear_with(200)
    doc.new_page().insert_image(pymupdf.Rect(100, 100, 300, 300), pixmap=pix)
    return doc.tobytes()


SCANNED_TEXT = [
    "The lighthouse keeper recorded every passing ship in a leather ledger. On stormy nights the "
    "lamp burned paraffin until dawn, and the fog horn sounded twice a minute across the bay.",
    "Quarterly revenue rose by 12 percent to 4.7 million euros, driven by orders for heat pumps "
    "from three municipal housing companies in the northern region.",
]


CHEAP_SCAN_TEXT = (
    "The harbour board met on a wet Tuesday to read the quarterly report of the pump station. "
    "Pressure at the river valve stayed under four bar, and the meter readings of the municipal "
    "housing blocks matched the ledger to the cent. The committee asked the tenant association "
    "for a schedule of payments, and the archive kept the minutes of the storm season in a "
    "cabinet by the observatory door. Invoice No. 17 for 4,700 EUR was approved without a vote."
)


def scanned(
    pages: list[str] | None = None, *, dpi: int = 150, turn: float = 0.0, speckle: float = 0.0
) -> bytes:
    """A scan of known text: each page typeset, rendered to a grey image at ``dpi``, and only the
    image kept (no text layer), as a flatbed scanner would write it. A cheap scanner's page:
    ``turn`` degrees counter-clockwise (negative: clockwise), and ``speckle``, the share of pixels
    flipped from ink to paper or back at random places."""
    source = text_pdf(pages or SCANNED_TEXT)
    with pymupdf.open(stream=source, filetype="pdf") as src:
        out = pymupdf.open()
        for page in src:
            pix = page.get_pixmap(dpi=dpi, colorspace=pymupdf.csGRAY)
            if turn or speckle:
                pix = _cheap_scanner(pix, turn, speckle)
            out.new_page(width=page.rect.width, height=page.rect.height).insert_image(
                page.rect, pixmap=pix
            )
        return out.tobytes(deflate=True)


def _cheap_scanner(pix, turn: float, speckle: float):
    import random

    from PIL import Image

    img = Image.frombytes("L", (pix.width, pix.height), pix.samples)
    if turn:
        img = img.rotate(turn, resample=Image.Resampling.BICUBIC, fillcolor=255)
    px, rng = img.load(), random.Random(7)
    for _ in range(int(img.width * img.height * speckle)):
        x, y = rng.randrange(img.width), rng.randrange(img.height)
        px[x, y] = 255 - px[x, y]
    return pymupdf.Pixmap(pymupdf.csGRAY, img.width, img.height, img.tobytes(), False)


def two_column_form() -> bytes:
    """Two columns written row by row, left then right on each baseline, as form generators do."""
    doc = pymupdf.open()
    page = doc.new_page()
    page.insert_text((72, 60), "Harbour survey form", fontsize=14)
    y = 100
    for left, right in zip(SENTENCES_LEFT, SENTENCES_RIGHT, strict=True):
        for x, sentence in ((72, left), (320, right)):
            # each column line wraps in two halves, like a narrow form column
            words = sentence.split()
            half = len(words) // 2
            page.insert_text((x, y), " ".join(words[:half]), fontsize=9)
            page.insert_text((x, y + 11), " ".join(words[half:]), fontsize=9)
        y += 30
    page.insert_text((72, 780), "Page footer of the harbour survey form", fontsize=8)
    return doc.tobytes()


def vertical_japanese(columns: list[str]) -> bytes:
    """Vertical Japanese (tategaki) in a CID font in vertical mode, columns right to left."""
    from reportlab.pdfbase import pdfmetrics
    from reportlab.pdfbase.cidfonts import UnicodeCIDFont
    from reportlab.pdfgen import canvas

    pdfmetrics.registerFont(UnicodeCIDFont("HeiseiMin-W3", isVertical=True))
    out = io.BytesIO()
    c = canvas.Canvas(out, pagesize=(595, 842))
    c.setFont("HeiseiMin-W3", 14)
    x = 520
    for column in columns:
        c.drawString(x, 790, column)
        x -= 26
    c.save()
    return out.getvalue()


def repaired_variants() -> dict[str, bytes]:
    """A sound three-page PDF and the ways its end arrives damaged in the wild."""
    good = text_pdf(
        [f"Readable page {i} describes the archive of the observatory." for i in (1, 2, 3)]
    )
    end = good.rindex(b"%%EOF")
    return {
        "nul_padding": good + b"\x00" * 4096,
        "trailing_bytes": good + b"trailing bytes after the end of file " * 100,
        "ends_at_startxref": good[: good.rindex(b"startxref") + len(b"startxref\n")],
        "no_eof_marker": good[:end],
    }


def cut_in_half() -> bytes:
    good = text_pdf(
        [f"Readable page {i} describes the archive of the observatory." for i in (1, 2, 3)]
    )
    return good[: len(good) // 2]


def without_header() -> bytes:
    good = text_pdf(["A PDF whose header line was lost still speaks of glaciers and moraines."])
    return good[good.index(b"\n") + 1 :]


def fonts_lost(*, damaged_end: bool) -> bytes:
    """Text in an embedded font whose objects are gone, as in the first half of a file cut short:
    MuPDF then returns glyph ids as control characters. ``damaged_end`` also pads the end, so the
    file opens only after repair."""
    doc = pymupdf.open()
    for i in range(2):
        page = doc.new_page()
        page.insert_font(fontname="F0", fontbuffer=pymupdf.Font("cjk").buffer)
        page.insert_text(
            (72, 72),
            f"Harbour records of the storm season, page {i + 1}.",
            fontname="F0",
            fontsize=11,
        )
    data = doc.tobytes(garbage=1)
    font = pymupdf.open(stream=data)[0].get_fonts()[0][0]
    unicode_map = int(pymupdf.open(stream=data).xref_get_key(font, "ToUnicode")[1].split()[0])
    for number in (font, unicode_map):  # blank the objects out, keeping every offset
        start = data.index(b"\n%d 0 obj" % number) + 1
        end = data.index(b"endobj", start) + len(b"endobj")
        data = data[:start] + b" " * (end - start) + data[end:]
    return data + (b"\x00" * 4096 if damaged_end else b"")
