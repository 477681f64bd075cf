"""The document view (AppTest): reached from a search hit and from a job, it shows the document's
metadata, jobs and versions, its chunks in order with pages, the chosen chunk's page rendered with
the chunk located on it, and a download of the original for operators only."""

from urllib.parse import parse_qsl

import pymupdf
import pytest

from sluice.ops.access import Operator, ReadOnlyOperator
from sluice.ops.document_view import original
from sluice.ops.ingest import ingest_bytes
from sluice.pipeline.running.runner import run_job
from tests.support.apptest import assert_ok, open_console, texts


def _pdf() -> bytes:
    doc = pymupdf.open()
    for n in range(1, 4):
        page = doc.new_page()
        line = (
            "The harbour crane KX-9904 was inspected on page three."
            if n == 3
            else f"Quiet page {n} of the log."
        )
        page.insert_text((72, 72), line)
    return doc.tobytes()


def _chunks_shown(at) -> str:
    """The chunk texts the page draws (as Markdown, punctuation escaped), read as text."""
    return "\n".join(m.value.replace("\\", "") for m in at.markdown)


def _indexed(ctx):
    r = ingest_bytes(ctx, _pdf(), dataset="default", filename="cranes.pdf")
    assert run_job(r.job_id, ctx=ctx).result == "succeeded"
    return r


def test_open_a_search_hit_see_its_chunks_page_image_and_download(ctx):
    r = _indexed(ctx)
    at = open_console("search")
    at.text_input(key="q").set_value("KX-9904")
    at.button[0].click().run()
    assert_ok(at)
    assert "**KX**-**9904**" in texts(at)
    link = next(
        p for p in at.get("page_link") if p.proto.label == "Open document"
    )  # the first hit's
    query = dict(parse_qsl(link.proto.query_string))
    assert query["doc"] == f"doc:{r.document_id}"

    at = open_console("document", query={"doc": f"doc:{r.document_id}", "chunk": query["chunk"]})
    page = texts(at)
    assert at.title[0].value == "Document" and "cranes.pdf" in page
    assert "application/pdf" in page and "chunk 2 · page 3" in page
    assert "KX-9904" in _chunks_shown(at)
    assert at.radio(key="document_chunk").value == 2  # the hit's chunk is the one located
    [image] = at.get("image")
    assert "the chunk highlighted" in str(image.proto)
    assert at.get("download_button")  # an operator may take the original
    jobs = at.dataframe[0].value
    assert list(jobs["job"]) == [r.job_id] and bool(jobs["serves search"][0])

    # The job detail links here too.
    at = open_console("jobs", query={"job": str(r.job_id)})
    links = [dict(parse_qsl(p.proto.query_string)) for p in at.get("page_link")]
    assert {"doc": f"doc:{r.document_id}"} in links, links


def test_a_read_only_user_sees_the_document_but_cannot_download_it(make_ctx):
    ctx = make_ctx(
        SLUICE_CONSOLE_PASSWORD="full-rights-5b1e",
        SLUICE_CONSOLE_READONLY_PASSWORD="look-only-7c2d",
    )
    r = _indexed(ctx)
    at = open_console(query={"doc": str(r.job_id)})
    at.switch_page("views/document_page.py")
    at.run()
    at.text_input(key="login_password").set_value("look-only-7c2d")
    at.button[0].click().run()
    assert_ok(at)
    assert at.title[0].value == "Document" and "cranes.pdf" in texts(at)
    assert "KX-9904" in _chunks_shown(at) and at.get("image")
    assert not at.get("download_button")
    assert "downloading the original is for operators" in texts(at)
    with pytest.raises(ReadOnlyOperator):
        original(ctx, Operator("viewer", "readonly"), r.document_id)


def test_a_pdf_with_a_huge_page_is_drawn_in_a_child_within_a_pixel_cap(ctx, monkeypatch):
    """Issue 26, finding 2: the Document page drew a 1 KB PDF with a huge page in the console's
    own process at full size (2.4 GB and 13.6 s for a 200-inch page). Now a child draws it, with
    the extraction limits and a pixel cap, and the page says it is drawn smaller."""
    import io
    import time

    from PIL import Image
    from streamlit.runtime.memory_media_file_storage import MemoryMediaFileStorage

    from sluice.console import ui

    MAX_PIXELS = 16_000_000  # sluice.ops.document_view.MAX_PIXELS

    pdf = pymupdf.open()
    pdf.new_page(width=6000, height=6000).insert_text((72, 72), "The giant chart of the estuary.")
    data = pdf.tobytes(garbage=4, deflate=True)
    assert len(data) < 2048
    r = ingest_bytes(ctx, data, dataset="default", filename="chart.pdf")
    assert run_job(r.job_id, ctx=ctx).result == "succeeded"
    drawn: list[bytes] = []
    keep = MemoryMediaFileStorage.load_and_get_id

    def seen(self, path_or_data, mimetype, kind, filename=None):
        if mimetype.startswith("image/") and isinstance(path_or_data, bytes):
            if Image.open(io.BytesIO(path_or_data)).size != ui.page_icon().size:  # not the tab's
                drawn.append(path_or_data)
        return keep(self, path_or_data, mimetype, kind, filename)

    monkeypatch.setattr(MemoryMediaFileStorage, "load_and_get_id", seen)
    here: list[tuple] = []  # pixmaps drawn in this (the console's) process
    pixmap = pymupdf.Page.get_pixmap
    monkeypatch.setattr(
        pymupdf.Page, "get_pixmap", lambda page, **kw: here.append(kw) or pixmap(page, **kw)
    )
    started = time.monotonic()
    at = open_console("document", query={"doc": f"doc:{r.document_id}"})
    assert time.monotonic() - started < 20
    assert here == []  # before: one 9000 x 9000 pixmap, in the console's process
    [shown] = drawn
    width, height = Image.open(io.BytesIO(shown)).size
    assert width * height <= MAX_PIXELS, (width, height)  # before: 9000 x 9000, in this process
    [image] = at.get("image")
    assert "drawn at" in str(image.proto) and "83 x 83 inches" in str(image.proto)
    again = open_console("document", query={"doc": f"doc:{r.document_id}"})
    assert again.get("image") and len(drawn) == 2  # the second run drew nothing new: cached


def test_each_version_of_an_external_id_lists_the_others_and_which_is_live(ctx):
    first = ingest_bytes(
        ctx, b"Version one of the rota.", dataset="default", filename="rota.txt", external_id="rota"
    )
    assert run_job(first.job_id, ctx=ctx).result == "succeeded"
    second = ingest_bytes(
        ctx, b"Version two of the rota.", dataset="default", filename="rota.txt", external_id="rota"
    )
    assert run_job(second.job_id, ctx=ctx).result == "succeeded"

    for shown, other in ((first, second), (second, first)):
        at = open_console("document", query={"doc": f"doc:{shown.document_id}"})
        assert_ok(at)
        [versions] = [d.value for d in at.dataframe if "version" in d.value.columns]
        assert list(versions["document"]) == [first.document_id, second.document_id]
        assert list(versions["state"]) == [f"replaced by document {second.document_id}", "live"]
        links = [p.proto.label for p in at.get("page_link")]
        assert any(f"document {other.document_id}" in label for label in links)


# The chunk switch's column, modelled as the browser lays it out: the main area of a 1280 px window
# with the sidebar open (wide layout, less its side padding), less the chunk's bordered container
# and the gaps between columns; the switch track, its gap and the help icon; a label's characters.
MAIN_WIDTH, PADDING, SWITCH, CHARACTER = 864, 48, 64, 8


def _widths(node, share: float = 1.0):
    """Each node of the page's tree with the share of the main area's width it is drawn in (a
    column gets its weight's share of the row it stands in)."""
    yield node, share
    children = list(getattr(node, "children", {}).values())
    row = sum(c.weight for c in children if getattr(c, "type", "") == "column")
    for child in children:
        weight = child.weight / row if getattr(child, "type", "") == "column" else 1.0
        yield from _widths(child, share * weight)


def test_the_chunk_switchs_label_fits_its_column_whole(ctx):
    r = _indexed(ctx)
    at = open_console("document", query={"doc": f"doc:{r.document_id}"})
    switches = [
        (node, share)
        for node, share in _widths(at.main)
        if getattr(node, "type", "") == "toggle" and node.key.startswith("document_chunk_on_")
    ]
    assert switches
    for switch, share in switches:
        room = share * MAIN_WIDTH - PADDING
        needed = SWITCH + CHARACTER * len(switch.label)
        # before: "Searchable" in a sixth of the main area, drawn as "Searc..."
        assert needed <= room, (switch.label, needed, round(room))
        assert "search answers" in switch.help  # what a short label leaves out, the help says


def test_a_chunk_is_edited_on_the_document_page_and_a_table_is_drawn_as_a_table(ctx):
    from sluice.storage import lexical
    from tests.test_reindex_diff import TABLE

    r = ingest_bytes(ctx, TABLE, dataset="default", filename="ports.csv")
    assert run_job(r.job_id, ctx=ctx).result == "succeeded"
    at = open_console("document", query={"doc": f"doc:{r.document_id}"})
    assert_ok(at)
    drawn = [m.value for m in at.markdown]  # before: the rows as plain text, no table
    assert any("| Rotterdam | 469 | 42 |" in m and "| --- |" in m for m in drawn), drawn
    [row] = lexical.job_chunks(ctx.engine, r.job_id)
    new = "Rotterdam handles the most tonnage of the three ports."
    at.text_area(key=f"document_chunk_text_{row.chunk_id}").set_value(new)
    at.button(key=f"FormSubmitter:document_chunk_edit_{row.chunk_id}-Save").click().run()
    assert_ok(at)
    assert [c.text for c in lexical.job_chunks(ctx.engine, r.job_id)] == [new]
    assert "embedded and indexed again" in texts(at)
    assert new in _chunks_shown(at)
    at.text_area(key=f"document_chunk_text_{row.chunk_id}").set_value("   ")
    at.button(key=f"FormSubmitter:document_chunk_edit_{row.chunk_id}-Save").click().run()
    assert "the chunk's text is empty" in texts(at)  # refused, said, nothing changed
    assert [c.text for c in lexical.job_chunks(ctx.engine, r.job_id)] == [new]
