"""Word, PowerPoint, HTML, EPUB and CSV files: told from their bytes, found by a phrase, with where
the text is; zip bombs refused with nothing stored."""

import io
import zipfile

import pytest
from sqlmodel import Session, select

from sluice.ops.ingest import ingest_bytes
from sluice.ops.search import search
from sluice.pipeline.parsing import formats
from sluice.pipeline.parsing.parse import sniff_type
from sluice.storage.models import Document, JobStatus
from tests.support.helpers import collection
from tests.support.helpers import run_file as run


def make_docx() -> bytes:
    import docx

    document = docx.Document()
    document.add_heading("Introduction", level=1)
    document.add_paragraph(
        "The ferry timetable changes every spring when the ice leaves the sound."
    )
    document.add_heading("Tariffs", level=1)
    document.add_paragraph(
        "A return ticket for a bicycle costs four euros on the morning crossing."
    )
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


def make_pptx() -> bytes:
    import pptx

    deck = pptx.Presentation()
    for title, body in (
        ("Quarter review", "Sales of wool blankets doubled in the coastal shops."),
        ("Next steps", "The beekeepers cooperative opens a second honey warehouse."),
    ):
        slide = deck.slides.add_slide(deck.slide_layouts[1])
        slide.shapes.title.text = title
        slide.placeholders[1].text = body
    out = io.BytesIO()
    deck.save(out)
    return out.getvalue()


HTML_PAGE = (
    b"""<!DOCTYPE html><html><head><title>Mill</title>
<style>.x { color: red } body { font-family: zanzibarfont }</style>
<script>var trackingpixel = "quokkasecret"; document.write("quokkasecret");</script></head>
<body><h1>The old mill</h1>"""
    b"""<p>The <b>water wheel</b> of the old mill ground rye flour until 1952.</p>
<h2>Repairs</h2><p>Volunteers replaced the oak paddles during the summer of 2019.</p>"""
    b"""</body></html>"""
)


def make_epub() -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as book:
        book.writestr(zipfile.ZipInfo("mimetype"), "application/epub+zip")
        book.writestr(
            "META-INF/container.xml",
            """<?xml version="1.0"?>
<container version="1.0" xmlns="urn:oasis:names:tc:opendocument:xmlns:container">
<rootfiles>"""
            """<rootfile full-path="OEBPS/content.opf" """
            """media-type="application/oebps-package+xml"/>"""
            """</rootfiles>
</container>""",
        )
        book.writestr(
            "OEBPS/content.opf",
            """<?xml version="1.0"?>
<package xmlns="http://www.idpf.org/2007/opf" version="3.0"><metadata/>
<manifest><item id="c1" href="one.xhtml" media-type="application/xhtml+xml"/>
<item id="c2" href="two.xhtml" media-type="application/xhtml+xml"/></manifest>
<spine><itemref idref="c1"/><itemref idref="c2"/></spine></package>""",
        )
        book.writestr(
            "OEBPS/one.xhtml",
            "<html><body><h1>Arrival</h1><p>The captain sighted the "
            "lighthouse at dawn.</p></body></html>",
        )
        book.writestr(
            "OEBPS/two.xhtml",
            "<html><body><h1>Harbour</h1><p>Stevedores unloaded crates of "
            "oranges from Valencia all afternoon.</p></body></html>",
        )
    return out.getvalue()


def make_csv() -> bytes:
    rows = ["station,river,level_cm,note"]
    rows += [f"S{i},Elbe,{100 + i},normal reading" for i in range(1, 400)]
    rows[311] = "S311,Moldau,612,flood warning issued for the old town embankment"
    return ("\n".join(rows) + "\n").encode()


CASES = {
    "report.docx": (
        make_docx,
        formats.DOCX,
        "bicycle return ticket price morning crossing",
        "section 2: Tariffs",
    ),
    "deck.pptx": (make_pptx, formats.PPTX, "beekeepers open a second honey warehouse", "slide 2"),
    "mill.html": (
        lambda: HTML_PAGE,
        formats.HTML,
        "volunteers replaced the oak paddles",
        "section 2: Repairs",
    ),
    "voyage.epub": (
        make_epub,
        formats.EPUB,
        "stevedores unloaded crates of oranges",
        "chapter 2, section 1: Harbour",
    ),
    "levels.csv": (
        make_csv,
        formats.CSV,
        "flood warning issued for the old town embankment",
        "rows 202-400",
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_new_type_is_found_by_a_phrase_and_says_where(ctx, name):
    make, media_type, phrase, where = CASES[name]
    data = make()
    j = run(ctx, data, name)
    assert j.status == JobStatus.succeeded, (j.error_code, j.error_message)
    with Session(ctx.engine) as session:
        assert session.get(Document, j.document_id).media_type == media_type
    hits = search(ctx, query=phrase, dataset="default", k=1)
    assert hits and hits[0].filename == name and hits[0].where
    ids = ctx.vectors.ids_where(collection(ctx), {"job_id": j.id})
    got = ctx.vectors.get(collection(ctx), ids, include=["metadatas", "documents"])
    places = {m["where"] for m in got["metadatas"]}
    assert where in places, places
    text = " ".join(got["documents"])
    assert "quokkasecret" not in text and "zanzibarfont" not in text and "<" not in text


HIDDEN_PAGE = (
    b"""<html><body><h1>Ferries</h1><p>The morning ferry leaves at seven.</p>
<div style="display:none">hiddenstyleword</div><p style="color: red; DISPLAY : None !important">
cappedstyleword</p><span style="visibility:hidden">invisibleword</span>
<section hidden><p>hiddenattrword<span aria-hidden="true">nestedword</span></p></section>"""
    b"""<div aria-hidden="true">ariaword</div>
<input type="hidden" value="inputword"><div aria-hidden="false">The evening ferry is late.</div>
<p style="display: block">The night ferry runs on Fridays.</p></body></html>"""
)


def test_hidden_html_is_never_indexed():
    """Text a reader of the page cannot see (display:none, visibility:hidden, the hidden attribute,
    aria-hidden) is dropped with what it contains; what is visible stays."""
    text = " ".join(body for _, body in formats.html_sections(HIDDEN_PAGE))
    for word in ("hiddenstyleword", "cappedstyleword", "invisibleword", "hiddenattrword"):
        assert word not in text
    assert "ariaword" not in text and "inputword" not in text and "nestedword" not in text
    for visible in ("morning ferry", "evening ferry", "night ferry"):
        assert visible in text


def test_types_come_from_the_bytes_not_the_name(ctx):
    assert sniff_type(HTML_PAGE, "notes.txt") == formats.HTML
    assert (
        sniff_type(b"just a sentence, with a comma\nand a second line\n", "table.csv")
        == "text/plain"
    )
    wrong = run(ctx, make_pptx(), "really-a-deck.docx")
    with Session(ctx.engine) as session:
        assert session.get(Document, wrong.document_id).media_type == formats.PPTX


def _stored(ctx) -> list:
    return [p for p in ctx.blobs.root.rglob("*") if p.is_file()] if ctx.blobs.root.exists() else []


def test_a_zip_bomb_disguised_as_docx_is_refused_and_nothing_is_stored(make_ctx):
    ctx = make_ctx(SLUICE_ARCHIVE_MAX_UNCOMPRESSED_MB="20")
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as bomb:
        bomb.writestr("[Content_Types].xml", "<Types/>")
        bomb.writestr("word/document.xml", b"\0" * (64 * 1024 * 1024))
    r = ingest_bytes(ctx, out.getvalue(), dataset="default", filename="invoice.docx")
    assert not r.accepted and r.error_code == "archive_too_large" and "zip bomb" in r.message
    assert "Nothing was stored" in r.fix_hint
    assert _stored(ctx) == []

    many = io.BytesIO()
    with zipfile.ZipFile(many, "w") as bomb:
        for i in range(10_001):
            bomb.writestr(f"word/{i}.xml", "")
    r = ingest_bytes(ctx, many.getvalue(), dataset="default", filename="contract.docx")
    assert not r.accepted and r.error_code == "archive_too_large" and "10,001 entries" in r.message
    assert _stored(ctx) == []
    with Session(ctx.engine) as session:
        assert session.exec(select(Document)).all() == []


DEEP = 30_000  # before the cap: about 3 s of parsing for 150 KB (1 MB took 21 s of CPU)


def _deep_epub() -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(make_epub())) as book, zipfile.ZipFile(out, "w") as copy:
        for item in book.infolist():
            data = book.read(item)
            if item.filename == "OEBPS/two.xhtml":
                data = ("<html><body>" + "<span>" * DEEP + "x" + "</body></html>").encode()
            copy.writestr(item, data)
    return out.getvalue()


@pytest.mark.parametrize("name", ["nested.html", "nested.epub"])
def test_deeply_nested_markup_is_refused_before_it_is_parsed(ctx, name):
    """Issue 26, finding 10: a hostile upload through the real job (its extraction child)."""
    import time

    if name.endswith(".html"):
        data = (
            "<html><body>" + "<div>" * DEEP + "deep" + "</div>" * DEEP + "</body></html>"
        ).encode()
    else:
        data = _deep_epub()
    started = time.monotonic()
    j = run(ctx, data, name)
    assert time.monotonic() - started < 2.5
    assert (j.status, j.error_kind, j.error_code) == (
        JobStatus.failed,
        "user_action_required",
        "html_too_deep",
    ), j.error_message
    assert "more than 512 deep" in j.error_message and "Save the page again" in j.fix_hint
    assert formats.nesting_depth("<p>a<p>b<ul><li>x<li>y</ul><br><img><script>'<b>'</script>") == 1
