"""Headings as context (issue 41.2): chunks follow the document's structure (a chunk ends at a
heading) and each carries its heading path, "Title > Section > Subsection", as a prefix that is
embedded and indexed with it and shown in hits. Real files, made here, read by the real
extraction code; the end-to-end test runs a real job and searches it."""

import io

import httpx
import pymupdf

from sluice.ops.search import search
from sluice.pipeline.parsing import formats
from sluice.pipeline.parsing.extract import MARKDOWN, Request, read
from sluice.pipeline.running.chunk import HEADING, chunk_pages, heading_of, split_text
from tests.support.api_server import InProcessApi, auth, make_key
from tests.support.helpers import run_file

BODY = "The engineers measured the flow of the river at every gauge along its course. "


def pages_of(path, media_type: str) -> list[tuple[int, str]]:
    return [
        (m["n"], m["text"])
        for m in read(Request(path=str(path), media_type=media_type))
        if m["t"] == "page"
    ]


def paths_of(chunks) -> list[str]:
    return [heading_of(c.text)[0] for c in chunks]


def report_pdf(*, outline: bool) -> bytes:
    """Title, two sections (one with a subsection) over two pages; sizes say which is which."""
    doc = pymupdf.open()
    page = doc.new_page()
    page.insert_text((72, 72), "River Survey", fontsize=24)
    page.insert_text((72, 110), "Methods", fontsize=16)
    y = 130
    for i in range(3):
        page.insert_text(
            (72, y), f"Gauge {i} was read twice a day by the survey team.", fontsize=11
        )
        y += 14
    page.insert_text((72, y + 16), "Calibration", fontsize=13)
    page.insert_text((72, y + 34), "Each gauge was checked against a reference staff.", fontsize=11)
    page.insert_text((72, y + 70), "Findings", fontsize=16)
    page.insert_text(
        (72, y + 90), "The spring flood peaked a week earlier than usual.", fontsize=11
    )
    second = doc.new_page()
    second.insert_text(
        (72, 72), "Sediment loads rose below the old weir after the flood.", fontsize=11
    )
    if outline:
        doc.set_toc([[1, "Methods", 1], [2, "Calibration", 1], [1, "Findings", 1]])
    return doc.tobytes()


def test_pdf_chunks_carry_their_heading_path_and_end_at_headings(tmp_path):
    for outline in (False, True):
        (tmp_path / "r.pdf").write_bytes(report_pdf(outline=outline))
        chunks = list(
            chunk_pages(pages_of(tmp_path / "r.pdf", "application/pdf"), size=800, overlap=50)
        )
        by_path = {heading_of(c.text)[0]: heading_of(c.text)[1] for c in chunks}
        assert paths_of(chunks) == [
            "River Survey > Methods",
            "River Survey > Methods > Calibration",
            "River Survey > Findings",
            "River Survey > Findings",  # page 2 starts inside the section page 1 ended in
        ], (outline, [c.text for c in chunks])
        # a chunk does not cross a heading, though the whole page fits one chunk
        assert "reference staff" not in by_path["River Survey > Methods"]
        assert "flood peaked" not in by_path["River Survey > Methods > Calibration"]
        assert chunks[-1].page == 2 and "weir" in chunks[-1].text
        assert all(HEADING not in c.text for c in chunks)


def test_a_mark_in_a_files_own_text_makes_no_heading(tmp_path):
    (tmp_path / "n.txt").write_text(f"{HEADING}# Not a heading\nplain words of a note\n")
    [(_, text)] = pages_of(tmp_path / "n.txt", "text/plain")
    assert HEADING not in text
    assert [heading_of(c)[0] for c in split_text(text, size=200, overlap=0)] == [""]


def test_markdown_headings_outside_code_are_the_path(tmp_path):
    (tmp_path / "g.md").write_text(
        "# Guide\n\nIntro words of the guide.\n\n## Install\n\nRun the installer.\n\n"
        "```\n# not a heading: a comment in code\n```\n\n### Windows\n\nUse the MSI file.\n"
    )
    chunks = list(chunk_pages(pages_of(tmp_path / "g.md", MARKDOWN), size=500, overlap=0))
    assert paths_of(chunks) == ["Guide", "Guide > Install", "Guide > Install > Windows"]
    assert "# not a heading" in chunks[1].text


def docx_report(path) -> None:
    import docx

    document = docx.Document()
    document.add_heading("Harbour Plan", level=0)
    document.add_heading("Berths", level=1)
    document.add_paragraph("Four new berths are dredged on the east quay.")
    document.add_heading("Costs", level=2)
    document.add_paragraph("Dredging costs two million over three years.")
    document.add_heading("Schedule", level=1)
    document.add_paragraph("Work starts after the autumn storms.")
    document.save(str(path))


def test_word_html_book_and_slide_sections_carry_their_paths(tmp_path):
    docx_report(tmp_path / "p.docx")
    (tmp_path / "p.html").write_text(
        "<html><head><title>Harbour Plan</title></head><body><h1>Berths</h1>"
        "<p>Four new berths are dredged on the east quay.</p><h2>Costs</h2>"
        "<p>Dredging costs two million over three years.</p><h1>Schedule</h1>"
        "<p>Work starts after the autumn storms.</p></body></html>"
    )
    expected = ["Harbour Plan > Berths", "Harbour Plan > Berths > Costs", "Harbour Plan > Schedule"]
    for name, media_type in (("p.docx", formats.DOCX), ("p.html", formats.HTML)):
        chunks = list(chunk_pages(pages_of(tmp_path / name, media_type), size=500, overlap=0))
        assert paths_of(chunks) == expected, (name, [c.text for c in chunks])
        assert "Dredging" in heading_of(chunks[1].text)[1]

    import pptx

    deck = pptx.Presentation()
    deck.core_properties.title = "Harbour Plan"
    slide = deck.slides.add_slide(deck.slide_layouts[1])
    slide.shapes.title.text = "Berths"
    slide.placeholders[1].text = "Four new berths are dredged on the east quay."
    out = io.BytesIO()
    deck.save(out)
    (tmp_path / "p.pptx").write_bytes(out.getvalue())
    chunks = list(chunk_pages(pages_of(tmp_path / "p.pptx", formats.PPTX), size=500, overlap=0))
    assert paths_of(chunks) == ["Harbour Plan > Berths"]


def test_a_long_section_is_cut_but_every_chunk_keeps_the_path():
    text = f"{HEADING} Manual\n{HEADING}## Safety\n" + BODY * 12
    chunks = split_text(text, size=200, overlap=20)
    assert len(chunks) > 3
    assert all(c.startswith("Manual > Safety\n\n\n") and len(c) <= 200 for c in chunks)


def test_the_path_is_embedded_indexed_and_shown_in_hits(database_url, make_ctx):
    ctx = make_ctx()
    job = run_file(ctx, report_pdf(outline=False), "survey.pdf")
    assert job.status.value == "succeeded", (job.error_code, job.error_message)
    for mode in ("lexical", "dense"):
        # "calibration" is only in the heading: the chunk under it is found by it
        hits = search(ctx, query="calibration", dataset="default", k=1, mode=mode)
        assert hits, mode
        hit = hits[0]
        assert hit.heading == "River Survey > Methods > Calibration", (mode, hit.text)
        assert "reference staff" in hit.text and hit.text.startswith(hit.heading)
        assert "calibration" not in hit.snippet.lower()  # the snippet is of the text under it
    with InProcessApi() as api:  # the API's hits carry it as a field of its own
        answer = httpx.post(
            f"{api.url}/v1/datasets/default/search",
            json={"query": "calibration", "k": 1, "mode": "lexical"},
            headers=auth(make_key("h", datasets=None, scope="read")),
            timeout=30,
        )
    assert answer.status_code == 200, answer.text
    assert answer.json()["hits"][0]["heading"] == "River Survey > Methods > Calibration"
